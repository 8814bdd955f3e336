#!/usr/bin/env bash
# Create (or update) the Secrets the manifests read, from the .env that
# infra/gen-env.sh writes: nothing secret is committed, and each namespace gets
# only the keys its Pods use.
#
#   infra/gen-env.sh runyard.env
#   deploy/kubernetes/create-secrets.sh runyard.env [postgres-host:port]
#
#   runyard/runyard-postgres         owner-url (the migration Job only), app-url,
#                                    secrets-url, logs-url
#   runyard/runyard-kafka            one password per service's broker user
#   runyard/runyard-internal         token (the services' internal APIs)
#   runyard-agents/runyard-internal  token (the deployer asks the log service)
#   runyard-agents/runyard-postgres  secrets-url (the deployer's role)
#   runyard-agents/runyard-kafka     deployer
#
# The Postgres roles and Kafka users must exist with the same passwords:
# infra/postgres/init-roles.sh and infra/kafka/setup.sh make them (run them
# against your servers with this .env's variables). Values go to kubectl as
# files of a private temporary folder, never on a command line.
set -euo pipefail

ENV_FILE=${1:?usage: create-secrets.sh ENV_FILE [postgres-host:port]}
PG=${2:-postgres.runyard.svc:5432}
DATABASE=runyard

set -a
# shellcheck disable=SC1090
. "$ENV_FILE"
set +a

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 700 "$dir"

put() {  # file value
  printf '%s' "$2" > "$dir/$1"
}

dsn() {  # role password
  echo "postgresql://$1:$2@$PG/$DATABASE"
}

put owner-url "$(dsn runyard_owner "$RUNYARD_DB_OWNER_PASSWORD")"
put app-url "$(dsn runyard_app "$RUNYARD_DB_APP_PASSWORD")"
put secrets-url "$(dsn runyard_secrets "$RUNYARD_DB_SECRETS_PASSWORD")"
put logs-url "$(dsn runyard_logs "$RUNYARD_DB_LOGS_PASSWORD")"
put token "$RUNYARD_INTERNAL_TOKEN"
for service in relay scheduler deployer faulttolerance notification logs gateway submission; do
  variable="KAFKA_PASSWORD_${service^^}"
  put "$service" "${!variable:?$variable is not in $ENV_FILE: run infra/gen-env.sh $ENV_FILE}"
done

secret() {  # namespace name keys...
  local namespace=$1 name=$2
  shift 2
  local args=()
  for key in "$@"; do args+=("--from-file=$key=$dir/$key"); done
  kubectl create secret generic "$name" --namespace "$namespace" "${args[@]}" \
    --dry-run=client -o yaml | kubectl apply -f -
}

secret runyard runyard-postgres owner-url app-url secrets-url logs-url
secret runyard runyard-kafka relay scheduler faulttolerance notification logs gateway submission
secret runyard runyard-internal token
secret runyard-agents runyard-postgres secrets-url
secret runyard-agents runyard-kafka deployer
secret runyard-agents runyard-internal token
