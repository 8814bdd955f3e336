# Runyard control plane: `runyard up` against external Postgres and Kafka.
#
# With DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS set (docker-compose.yml sets
# them), `runyard up` starts no embedded server: it applies the migrations,
# creates the topics, and runs the outbox relay and every built service in one
# process (see libs/stack/up.py and docs/operations.md).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The single pyproject maps libs/* and services/* into the `runyard` namespace
# (docs/adr/0001-layout-and-packaging.md); the editable install needs them here.
COPY pyproject.toml constraints.txt ./
COPY libs ./libs
COPY services ./services
# Pool and catalogue configuration, read from RUNYARD_CONFIG (default infra/config).
COPY infra/config ./infra/config

RUN pip install --no-cache-dir -c constraints.txt -e .

EXPOSE 8080

# This is `runyard up` with one difference: the CLI command has no --host
# option and binds the HTTP API to 127.0.0.1, which a published container
# port cannot reach. `runyard.stack.up.main` takes the host as an argument.
# State that `runyard up` writes (dev token, env file) goes to /app/.runyard.
CMD ["python", "-c", "from runyard.stack.up import main; main(host='0.0.0.0')"]
