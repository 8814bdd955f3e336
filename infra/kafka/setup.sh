#!/usr/bin/env bash
# Broker users and ACLs of Runyard's services (docker-compose's `kafka-setup`).
#
# Runs in the kafka container's network namespace (network_mode: service:kafka)
# and talks to the broker over its INTERNAL listener, which listens on the
# container's loopback only and is the one place without SASL (its principal,
# User:ANONYMOUS, is the broker's super user, for the controller too). Every
# other client comes through the CLIENT listener (SASL_PLAINTEXT, SCRAM-SHA-512)
# and may do only what its ACLs below allow. Idempotent: run at every `up`.
#
# What each service principal may do (topics under $RUNYARD_TOPIC_PREFIX):
#   runyard-relay          create topics; write every runyard.* topic (the relay,
#                          and `runyard up` creating the topics at start)
#   runyard-scheduler      read task-events, pool-events (group scheduler)
#   runyard-deployer       read task-events (group deployer); write logs; read
#                          and create deployer-commands (groups deployer-commands
#                          and deployer-commands.<node agent>: one per agent)
#   runyard-faulttolerance read task-events, logs (group faulttolerance) and
#                          pool-events (groups faulttolerance-pools-<instance>:
#                          one per instance); write deployer-commands (stack
#                          captures)
#   runyard-notification   read task-events (group notification)
#   runyard-logs           read logs (group logs)
#   runyard-gateway        (describe only, below)
#   runyard-submission     (describe only, below)
# Every event consumer may also write the dead-letter topic. Every user may
# describe every runyard.* topic: a service started on its own
# (`runyard serve <name>`) checks at start that all topics exist, and creates
# none when they do (only the relay's user may create). One user per service,
# so that each service's container holds its own password only.
set -euo pipefail

BOOTSTRAP=${KAFKA_SETUP_BOOTSTRAP:-127.0.0.1:9094}
BIN=/opt/kafka/bin
PREFIX="${RUNYARD_TOPIC_PREFIX:-}runyard."

topic() { echo "${PREFIX}$1"; }

add_user() {  # name password
  if [[ ! "$2" =~ ^[A-Za-z0-9_-]{16,}$ ]]; then
    echo "kafka-setup: the password of $1 must be 16+ characters of [A-Za-z0-9_-]:" \
      "run infra/gen-env.sh" >&2
    exit 1
  fi
  "$BIN/kafka-configs.sh" --bootstrap-server "$BOOTSTRAP" --alter --entity-type users \
    --entity-name "$1" --add-config "SCRAM-SHA-512=[iterations=8192,password=$2]" >/dev/null
}

allow() {  # principal, then kafka-acls arguments
  local principal=$1
  shift
  "$BIN/kafka-acls.sh" --bootstrap-server "$BOOTSTRAP" --add --allow-principal "User:$principal" \
    "$@" >/dev/null
}

consumer() {  # service group topics...
  local service=$1 group=$2
  shift 2
  local args=()
  for t in "$@"; do args+=(--topic "$(topic "$t")"); done
  allow "runyard-$service" --operation Read --operation Describe "${args[@]}"
  allow "runyard-$service" --operation Read --group "${RUNYARD_TOPIC_PREFIX:-}$group"
}

for service in RELAY SCHEDULER DEPLOYER FAULTTOLERANCE NOTIFICATION LOGS GATEWAY SUBMISSION; do
  variable="KAFKA_PASSWORD_${service}"
  if [[ -z "${!variable:-}" ]]; then
    echo "kafka-setup: $variable is not set: run infra/gen-env.sh" >&2
    exit 1
  fi
  add_user "runyard-${service,,}" "${!variable}"
done

allow runyard-relay --operation Create --operation Write --operation Describe \
  --topic "$PREFIX" --resource-pattern-type prefixed
consumer scheduler scheduler task-events pool-events
consumer deployer deployer task-events
allow runyard-deployer --operation Write --operation Describe --topic "$(topic logs)"
allow runyard-deployer --operation Read --operation Describe --operation Create \
  --topic "$(topic deployer-commands)"
allow runyard-deployer --operation Read \
  --group "${RUNYARD_TOPIC_PREFIX:-}deployer-commands" --resource-pattern-type prefixed
allow runyard-faulttolerance --operation Write --operation Describe \
  --topic "$(topic deployer-commands)"
consumer faulttolerance faulttolerance task-events logs
allow runyard-faulttolerance --operation Read --operation Describe --topic "$(topic pool-events)"
allow runyard-faulttolerance --operation Read \
  --group "${RUNYARD_TOPIC_PREFIX:-}faulttolerance-pools-" --resource-pattern-type prefixed
consumer notification notification task-events
consumer logs logs logs
for service in scheduler deployer faulttolerance notification; do
  allow "runyard-$service" --operation Write --operation Describe --topic "$(topic dead-letter)"
done
for service in scheduler deployer faulttolerance notification logs gateway submission; do
  allow "runyard-$service" --operation Describe --topic "$PREFIX" --resource-pattern-type prefixed
done
echo "kafka-setup: users and ACLs of" \
  "runyard-{relay,scheduler,deployer,faulttolerance,notification,logs,gateway,submission} in place"
