#!/usr/bin/env bash
# Runyard's Postgres roles for docker-compose (the same as `runyard up` makes
# on its embedded server, runyard.stack.roles):
#
#   runyard_owner    owns database `runyard`; the migrations run as it
#   runyard_app      DML on every table but `secrets` (relay, scheduler, ...)
#   runyard_secrets  runyard_app + the `secrets` table (gateway, deployer, notification)
#   runyard_logs     runyard_app + owns log_lines and its day partitions (log service)
#
# None is SUPERUSER, CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS, and none
# is a member of pg_execute_server_program / pg_read_server_files /
# pg_write_server_files. The table rights are granted by `runyard up` as
# runyard_owner after the migrations (runyard.stack.roles.apply_grants).
#
# The postgres image runs this once, as the `postgres` OS user, when it
# initialises an empty data volume. The passwords come from the environment
# (.env, written by infra/gen-env.sh).
set -euo pipefail

for variable in RUNYARD_DB_OWNER_PASSWORD RUNYARD_DB_APP_PASSWORD \
                RUNYARD_DB_SECRETS_PASSWORD RUNYARD_DB_LOGS_PASSWORD; do
  if [[ -z "${!variable:-}" ]]; then
    echo "init-roles: $variable is not set: run infra/gen-env.sh, then recreate the volume" >&2
    exit 1
  fi
done

psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname postgres \
  -v owner_pw="$RUNYARD_DB_OWNER_PASSWORD" \
  -v app_pw="$RUNYARD_DB_APP_PASSWORD" \
  -v secrets_pw="$RUNYARD_DB_SECRETS_PASSWORD" \
  -v logs_pw="$RUNYARD_DB_LOGS_PASSWORD" <<'SQL'
SET password_encryption = 'scram-sha-256';
CREATE ROLE runyard_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'owner_pw';
CREATE ROLE runyard_app LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'app_pw';
CREATE ROLE runyard_secrets LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'secrets_pw';
CREATE ROLE runyard_logs LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD :'logs_pw';
GRANT runyard_app TO runyard_secrets, runyard_logs;
-- The owner may act as the log role, so that migrations can alter what it owns.
GRANT runyard_logs TO runyard_owner;
CREATE DATABASE runyard OWNER runyard_owner;
REVOKE ALL ON DATABASE runyard FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE runyard TO runyard_app;
REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;
SQL

# Who may log in how: the superuser only on the container's own socket as the
# `postgres` OS user (`docker compose exec -u postgres postgres psql`); the
# four roles over the network to database runyard with scram-sha-256; nothing else.
cat > "$PGDATA/pg_hba.conf" <<'HBA'
# TYPE  DATABASE  USER  ADDRESS  METHOD
local   all       postgres                                   peer
host    runyard   runyard_owner,runyard_app,runyard_secrets,runyard_logs  all  scram-sha-256
HBA
echo "init-roles: roles runyard_owner, runyard_app, runyard_secrets, runyard_logs created"
