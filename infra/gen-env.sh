#!/usr/bin/env bash
# Write .env (mode 0600) with a random password for every Postgres role and
# Kafka user docker-compose.yml needs, and the internal token the gateway
# presents to the submission service's gRPC API. Keeps the values already
# there: the Postgres roles and Kafka users are created once, with the first
# values (a value added later, e.g. a new service's user, is appended).
#
#   infra/gen-env.sh [path]        (default: .env next to docker-compose.yml)
set -euo pipefail

ENV_FILE=${1:-"$(cd "$(dirname "$0")/.." && pwd)/.env"}
umask 077
touch "$ENV_FILE"
chmod 600 "$ENV_FILE"

random() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }  # 48 hex digits

for name in POSTGRES_SUPERUSER_PASSWORD \
            RUNYARD_DB_OWNER_PASSWORD RUNYARD_DB_APP_PASSWORD \
            RUNYARD_DB_SECRETS_PASSWORD RUNYARD_DB_LOGS_PASSWORD \
            KAFKA_PASSWORD_RELAY KAFKA_PASSWORD_SCHEDULER KAFKA_PASSWORD_DEPLOYER \
            KAFKA_PASSWORD_FAULTTOLERANCE KAFKA_PASSWORD_NOTIFICATION KAFKA_PASSWORD_LOGS \
            KAFKA_PASSWORD_GATEWAY KAFKA_PASSWORD_SUBMISSION \
            RUNYARD_INTERNAL_TOKEN; do
  if ! grep -q "^${name}=" "$ENV_FILE"; then
    echo "${name}=$(random)" >> "$ENV_FILE"
  fi
done
echo "passwords in $ENV_FILE (mode 600); keep it out of version control"
