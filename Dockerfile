# Runyard control plane: by default one image with every service (SERVICE below).
#
# Each container runs one service, `runyard serve <name>` (relay, gateway,
# submission, scheduler, deployer, faulttolerance, logs, notification), against
# external Postgres and Kafka (docker-compose.yml, deploy/kubernetes). The
# default command is the one-process layout, `runyard up` on 0.0.0.0, for a
# quick look: with DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS set it starts no
# embedded server (libs/stack/src/runyard/stack/up.py). See docs/deployment.md.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RUNYARD_CONFIG=/app/infra/config \
    RUNYARD_HOME=/var/lib/runyard

# util-linux (unshare, nsenter, setpriv), mount and passwd (useradd) are what
# the deployer's worker sandbox runs (docs/deployer.md, "Worker isolation");
# the base image has them already: named here so that a slimmer base fails the
# build instead of silently running workers unsandboxed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends util-linux mount passwd \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Every lib and service is a distribution of its own (libs/<name>, services/<name>;
# docs/adr/0008-members-and-namespace.md). SERVICE picks what this image installs:
# `all` (the default, what docker-compose.yml builds) is every member and the whole
# platform (`runyard up`); a service's name is that service, the members it
# depends on and libs/cli (`runyard serve <name>`), as infra/members.py lists them:
#   docker build --build-arg SERVICE=gateway -t runyard-gateway .
ARG SERVICE=all
COPY pyproject.toml constraints.txt ./
COPY infra/members.py ./infra/
COPY libs ./libs
COPY services ./services
RUN pip install --no-cache-dir -c constraints.txt $(python infra/members.py "$SERVICE") \
    && rm -rf build libs/*/build services/*/build

# Pool, catalogue and runtime configuration (RUNYARD_CONFIG; Kubernetes mounts
# its ConfigMap over it), the containers' health probe and the one-shot
# steps (infra/bootstrap.py: migrations and topics, the first admin token).
COPY infra/config ./infra/config
COPY infra/healthcheck.py infra/bootstrap.py ./infra/

# Every service but the deployer runs as this unprivileged user (uid 10001, so
# Kubernetes' runAsNonRoot can check it by number). The deployer runs as root
# (`user: "0"` / runAsUser: 0): its sandbox makes namespaces and drops each
# worker to an unprivileged user of its own.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /var/lib/runyard runyard \
    && mkdir -p /var/lib/runyard \
    && chown runyard:runyard /var/lib/runyard
USER 10001

# Gateway HTTP and gRPC; the other services' HTTP faces (8101-8107) and the
# submission service's internal gRPC (50052).
EXPOSE 8080 50051 8101 8102 8103 8104 8105 8106 8107 50052

CMD ["python", "-c", "from runyard.stack.up import main; main(host='0.0.0.0', home='/var/lib/runyard')"]
