"""The production layout agrees with the code: docker-compose.yml and deploy/kubernetes.

No Docker engine or cluster runs here, so these read the files. Every
Kubernetes manifest is validated against the API schemas of one pinned
Kubernetes version (kubernetes-validate ships them, offline, strict: unknown
fields fail). Both layouts must run the same set of services as the code
(`runyard.stack.up.SERVICES`), each as `runyard serve <name>` on its port,
with its own Postgres role and broker user, health probes on its HTTP face,
and no secret value committed. The checks are functions returning what is
wrong, so that a mutated copy (a service left out) shows they can fail.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions
from runyard.messaging.settings import KafkaSecurity
from runyard.stack import roles
from runyard.stack.context import ServiceContext
from runyard.stack.up import SERVICES

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
SETUP = (REPO / "infra" / "kafka" / "setup.sh").read_text()
SECRETS_SCRIPT = (K8S / "create-secrets.sh").read_text()

#: The Kubernetes version the manifests are validated against: the oldest they
#: support (securityContext.appArmorProfile, which the deployer uses, is GA in 1.31).
K8S_VERSION = "1.31.0"

#: Each service's HTTP face (docs/deployment.md); the gateway's is its public port.
PORTS = {
    "relay": 8101,
    "gateway": 8080,
    "submission": 8102,
    "scheduler": 8103,
    "deployer": 8104,
    "faulttolerance": 8105,
    "logs": 8106,
    "notification": 8107,
}
GATEWAY_GRPC = 50051
SUBMISSION_GRPC = 50052
#: Singletons: one active, a standby by Postgres lease.
ACTIVE_STANDBY = {"relay", "scheduler"}
#: Those whose standby is not Ready (/readyz 503 while it waits for the lease).
STANDBY_NOT_READY = {"relay"}
#: Consumer-group services: replicas share the partitions.
SCALED_OUT = {"logs", "notification", "faulttolerance"}
#: One replica, no disruption budget (a budget of one would block every drain).
SINGLE = {"gateway", "submission"}
#: The Secret key of each Postgres role's DSN (deploy/kubernetes/create-secrets.sh).
ROLE_KEYS = {
    roles.OWNER: "owner-url",
    roles.APP: "app-url",
    roles.SECRETS: "secrets-url",
    roles.LOGS: "logs-url",
}
#: The .env variable of each Postgres role's password (infra/gen-env.sh).
ROLE_PASSWORDS = {
    roles.OWNER: "RUNYARD_DB_OWNER_PASSWORD",
    roles.APP: "RUNYARD_DB_APP_PASSWORD",
    roles.SECRETS: "RUNYARD_DB_SECRETS_PASSWORD",
    roles.LOGS: "RUNYARD_DB_LOGS_PASSWORD",
}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def code_services() -> set[str]:
    """The services `runyard up` starts (`runyard.logs.main:run` -> logs), the relay
    among them (once started apart from the list: it is added if it is not in it)."""
    return {spec.split(".")[1].split(":")[0] for spec in SERVICES} | {"relay"}


def role_of(service: str) -> str:
    role: str = roles.SERVICE_ROLES.get(service, roles.APP)
    return role


# --- docker-compose.yml --------------------------------------------------------


def load_compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return loaded


def resolved(env: dict[str, Any]) -> dict[str, str]:
    """The environment with every ${VAR:?...} / ${VAR:-default} given a value, as
    compose would with a .env from infra/gen-env.sh."""

    def value(match: re.Match[str]) -> str:
        name, operator, default = match.groups()
        return default if operator == ":-" else f"pw-{name.lower()}"

    pattern = r"\$\{([A-Z_]+)(:\?|:-)([^}]*)\}"
    return {key: re.sub(pattern, value, str(v)) for key, v in env.items()}


def compose_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Compose services that run a Runyard service: name -> definition."""
    return {
        name: service
        for name, service in compose["services"].items()
        if list(service.get("command", []))[:2] == ["runyard", "serve"]
    }


def service_set_problems(compose_names: set[str], k8s_names: set[str], code: set[str]) -> list[str]:
    """What differs between the services of compose, of Kubernetes and of the code."""
    problems = []
    for layout, names in (("docker-compose.yml", compose_names), ("deploy/kubernetes", k8s_names)):
        if missing := sorted(code - names):
            problems.append(f"{layout} does not run {missing}")
        if extra := sorted(names - code):
            problems.append(f"{layout} runs {extra}, which runyard.stack.up.SERVICES does not name")
    return problems


def compose_service_problems(name: str, service: dict[str, Any]) -> list[str]:
    """What is wrong with compose service `name` (empty: nothing)."""
    problems = []
    env = resolved(service.get("environment", {}))
    port = PORTS.get(name)
    if service.get("command") != ["runyard", "serve", name]:
        problems.append(f"command {service.get('command')} is not `runyard serve {name}`")
    if not service.get("image") or not service.get("build"):
        problems.append("no image built from ./Dockerfile")
    test = service.get("healthcheck", {}).get("test", [])
    if test[-3:] != ["/app/infra/healthcheck.py", str(port), "/healthz"]:
        problems.append(f"healthcheck {test} does not probe /healthz on {port}")
    if env.get("RUNYARD_SERVICE_PORT") != str(port):
        problems.append(f"RUNYARD_SERVICE_PORT={env.get('RUNYARD_SERVICE_PORT')}, not {port}")
    if env.get("RUNYARD_SERVICE_HOST") != "0.0.0.0":
        problems.append("RUNYARD_SERVICE_HOST is not 0.0.0.0 (unreachable from other containers)")
    role = role_of(name)
    dsn = f"postgresql://{role}:pw-{ROLE_PASSWORDS[role].lower()}@postgres:5432/{roles.DATABASE}"
    if env.get("DATABASE_URL") != dsn:
        problems.append(f"DATABASE_URL is not role {role}'s: {env.get('DATABASE_URL')}")
    if "RUNYARD_OWNER_DATABASE_URL" in env:
        problems.append("holds the owner role's DSN (only `migrate` may)")
    if (env.get("KAFKA_SASL_USERNAME"), env.get("KAFKA_SASL_PASSWORD")) != (
        f"runyard-{name}",
        f"pw-kafka_password_{name}",
    ):
        problems.append(f"broker user is not runyard-{name} with its own password")
    if not env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        problems.append("OTEL_EXPORTER_OTLP_ENDPOINT unset")
    depends = service.get("depends_on", {})
    for dependency, condition in (
        ("postgres", "service_healthy"),
        ("kafka", "service_healthy"),
        ("migrate", "service_completed_successfully"),
    ):
        if depends.get(dependency, {}).get("condition") != condition:
            problems.append(f"depends_on {dependency} is not {condition}")
    return problems


def expected_endpoints(host: dict[str, str]) -> dict[str, str]:
    """RUNYARD_ENDPOINTS for services reached at host[name] (a DNS name)."""
    endpoints = {name: f"http://{host[name]}:{port}" for name, port in PORTS.items()}
    endpoints["submission-grpc"] = f"{host['submission']}:{SUBMISSION_GRPC}"
    return endpoints


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def test_compose_runs_one_container_per_service(compose: dict[str, Any]) -> None:
    services = compose_services(compose)
    assert service_set_problems(set(services), code_services(), code_services()) == []
    for name, service in services.items():
        assert compose_service_problems(name, service) == [], name
    for infra in ("postgres", "kafka", "kafka-setup", "otel-collector", "migrate"):
        assert infra in compose["services"], infra


def test_compose_services_build_their_context_from_that_environment(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each container's environment is one `ServiceContext.from_env` accepts, with every
    service's URL on the compose network and the broker user of its own."""
    endpoints = expected_endpoints({name: name for name in PORTS})
    for name, service in compose_services(compose).items():
        with monkeypatch.context() as env:
            for key, value in resolved(service["environment"]).items():
                env.setenv(key, value)
            ctx = ServiceContext.from_env().for_service(name)
        assert ctx.endpoints == endpoints, name
        assert ctx.kafka.bootstrap == "kafka:9092"
        assert ctx.kafka.security.protocol == "SASL_PLAINTEXT"
        assert ctx.kafka.security.username == f"runyard-{name}"


def test_compose_publishes_the_gateway_and_only_on_loopback(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    assert set(gateway["ports"]) >= {
        f"127.0.0.1:{PORTS['gateway']}:{PORTS['gateway']}",
        f"127.0.0.1:{GATEWAY_GRPC}:{GATEWAY_GRPC}",
    }
    settings = json.loads(resolved(gateway["environment"])["RUNYARD_SETTINGS"])
    assert (settings["grpc_host"], settings["grpc_port"]) == ("0.0.0.0", GATEWAY_GRPC)
    submission = json.loads(
        resolved(compose["services"]["submission"]["environment"])["RUNYARD_SETTINGS"]
    )
    assert submission == {"submission_grpc_host": "0.0.0.0", "submission_grpc_port": 50052}
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        if name != "gateway" and name != "otel-collector":
            assert "ports" not in service, name


#: The services that call or serve an internal API: only they hold the service credential.
INTERNAL_TOKEN_HOLDERS = {"gateway", "submission", "logs", "notification", "deployer"}


def test_compose_internal_apis_share_the_internal_token(compose: dict[str, Any]) -> None:
    tokens = {
        name: service.get("environment", {}).get("RUNYARD_INTERNAL_TOKEN")
        for name, service in compose["services"].items()
    }
    holders = {name for name, token in tokens.items() if token}
    assert holders == INTERNAL_TOKEN_HOLDERS
    assert len({tokens[name] for name in holders}) == 1
    assert "RUNYARD_INTERNAL_TOKEN" in (REPO / "infra" / "gen-env.sh").read_text()


def test_every_required_compose_variable_is_written_by_gen_env() -> None:
    required = set(re.findall(r"\$\{([A-Z_]+):\?", (REPO / "docker-compose.yml").read_text()))
    script = (REPO / "infra" / "gen-env.sh").read_text()
    assert required, "docker-compose.yml requires no variable from .env?"
    assert sorted(v for v in required if not re.search(rf"\b{v}\b", script)) == []


def test_compose_migrate_is_the_only_owner(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    env = resolved(migrate["environment"])
    owner = roles.OWNER
    assert env["RUNYARD_OWNER_DATABASE_URL"].startswith(f"postgresql://{owner}:pw-")
    assert env["KAFKA_SASL_USERNAME"] == "runyard-relay"  # the one user that may create topics
    assert migrate["command"] == ["python", "/app/infra/bootstrap.py", "migrate"]
    assert migrate["depends_on"]["kafka-setup"]["condition"] == "service_completed_successfully"
    holders = [
        name
        for name, service in compose["services"].items()
        if "RUNYARD_DB_OWNER_PASSWORD" in json.dumps(service.get("environment", {}))
    ]
    assert sorted(holders) == ["migrate", "postgres"]


def test_compose_deployer_gets_what_the_sandbox_needs_and_no_more(compose: dict[str, Any]) -> None:
    deployer = compose["services"]["deployer"]
    assert deployer["user"] == "0"
    assert set(deployer["cap_add"]) == {"SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"}
    assert "privileged" not in deployer
    for name, service in compose_services(compose).items():
        if name != "deployer":
            assert "cap_add" not in service and "user" not in service, name


def test_every_broker_user_is_made_by_kafka_setup(compose: dict[str, Any]) -> None:
    users = re.search(r"for service in ([A-Z ]+); do", SETUP)
    assert users is not None
    made = {f"runyard-{user.lower()}" for user in users.group(1).split()}
    used = {
        resolved(service["environment"])["KAFKA_SASL_USERNAME"]
        for service in compose_services(compose).values()
    }
    assert used <= made, used - made
    setup_env = compose["services"]["kafka-setup"]["environment"]
    for user in users.group(1).split():
        assert f"KAFKA_PASSWORD_{user}" in setup_env
    for service in compose_services(compose).values():
        KafkaSecurity.from_env(resolved(service["environment"]))  # complete and consistent


# --- deploy/kubernetes -------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def load_manifests() -> list[dict[str, Any]]:
    return [
        doc
        for path in manifest_files()
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (doc for doc in docs if doc["kind"] in WORKLOADS)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def served(workload: dict[str, Any]) -> str | None:
    """The service a workload runs (`runyard serve <name>`), else None."""
    command = pod_spec(workload)["containers"][0].get("command", [])
    return str(command[2]) if command[:2] == ["runyard", "serve"] and len(command) == 3 else None


def k8s_services(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: w for w in workloads(docs) if (name := served(w)) is not None}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def secret_keys() -> dict[tuple[str, str], set[str]]:
    """(namespace, Secret) -> keys, as deploy/kubernetes/create-secrets.sh makes them."""
    made: dict[tuple[str, str], set[str]] = {}
    for line in SECRETS_SCRIPT.splitlines():
        if line.startswith("secret runyard"):
            _, namespace, name, *keys = shlex.split(line)
            made[(namespace, name)] = set(keys)
    return made


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return load_manifests()


def test_the_pinned_kubernetes_version_is_shipped_offline() -> None:
    assert K8S_VERSION in all_versions()


def test_every_manifest_is_listed_in_the_kustomization() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in manifest_files())


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_is_valid_for_the_pinned_kubernetes(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is not None:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={}),
        lambda d: d["spec"].update(replicas="two"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"),
    ],
    ids=["unknown-field", "wrong-type", "missing-required"],
)
def test_the_schema_check_refuses_a_broken_manifest(
    manifests: list[dict[str, Any]], mutate: Any
) -> None:
    broken = copy.deepcopy(next(d for d in manifests if d["kind"] == "Deployment"))
    mutate(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kubernetes_runs_every_service_with_its_port_and_probes(
    manifests: list[dict[str, Any]],
) -> None:
    services = k8s_services(manifests)
    assert service_set_problems(code_services(), set(services), code_services()) == []
    kube_services = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for d in manifests
        if d["kind"] == "Service"
    }
    for name, workload in services.items():
        container = pod_spec(workload)["containers"][0]
        port = PORTS[name]
        assert container["ports"][0] == {"name": "http", "containerPort": port}, name
        assert env_of(container)["RUNYARD_SERVICE_PORT"] == str(port), name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        kube = kube_services[(workload["metadata"]["namespace"], name)]
        assert kube["spec"]["ports"][0]["port"] == port, name
        assert kube["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"], name
    assert services["deployer"]["kind"] == "DaemonSet"


def test_kubernetes_replicas_and_failover(manifests: list[dict[str, Any]]) -> None:
    services = k8s_services(manifests)
    budgets = {d["metadata"]["name"] for d in manifests if d["kind"] == "PodDisruptionBudget"}
    for name in ACTIVE_STANDBY:
        assert services[name]["spec"]["replicas"] == 2, name
    for name in STANDBY_NOT_READY:
        # Its standby is never Ready: a rollout must not wait for it, a budget not count it.
        strategy = services[name]["spec"]["strategy"]
        assert strategy["rollingUpdate"]["maxUnavailable"] == "100%", name
        assert name not in budgets, name
    for name in ACTIVE_STANDBY - STANDBY_NOT_READY:
        assert name in budgets, name
    for name in SCALED_OUT:
        assert services[name]["spec"]["replicas"] == 2, name
        assert name in budgets, name
    for name in SINGLE:
        assert services[name]["spec"]["replicas"] == 1, name
        assert name not in budgets, name
    # Each fault-tolerance replica reads the pool events in a group named after it:
    # stable pod names (a StatefulSet) keep the group across restarts.
    faulttolerance = services["faulttolerance"]
    assert faulttolerance["kind"] == "StatefulSet"
    (container,) = faulttolerance["spec"]["template"]["spec"]["containers"]
    (instance,) = [e for e in container["env"] if e["name"] == "RUNYARD_INSTANCE"]
    assert instance["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_kubernetes_endpoints_name_every_service(manifests: list[dict[str, Any]]) -> None:
    envs = [
        d for d in manifests if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "runyard-env"
    ]
    assert {d["metadata"]["namespace"] for d in envs} == {"runyard", "runyard-agents"}
    assert envs[0]["data"] == envs[1]["data"]
    services = k8s_services(manifests)
    host = {
        name: f"{name}.{services[name]['metadata']['namespace']}.svc" for name in code_services()
    }
    endpoints = json.loads(envs[0]["data"]["RUNYARD_ENDPOINTS"])
    assert endpoints == expected_endpoints(host)
    assert urlsplit(envs[0]["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"]).port == 4318


def test_kubernetes_credentials_come_from_secrets_of_the_right_role(
    manifests: list[dict[str, Any]],
) -> None:
    assert not [d for d in manifests if d["kind"] == "Secret"]  # no value committed
    made = secret_keys()
    for workload in workloads(manifests):
        namespace = workload["metadata"]["namespace"]
        for container in pod_spec(workload)["containers"]:
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["key"] in made[(namespace, ref["name"])], (namespace, ref)
    for name, workload in k8s_services(manifests).items():
        env = env_of(pod_spec(workload)["containers"][0])
        dsn = env["DATABASE_URL"]["secretKeyRef"]
        assert dsn == {"name": "runyard-postgres", "key": ROLE_KEYS[role_of(name)]}, name
        assert env["KAFKA_SASL_USERNAME"] == f"runyard-{name}"
        assert env["KAFKA_SASL_PASSWORD"]["secretKeyRef"] == {"name": "runyard-kafka", "key": name}
    owners = [
        w["metadata"]["name"]
        for w in workloads(manifests)
        if "owner-url" in json.dumps(pod_spec(w))
    ]
    assert owners == ["runyard-migrate"]


def test_kubernetes_pods_run_as_the_restricted_profile_asks(
    manifests: list[dict[str, Any]],
) -> None:
    """Every Pod of namespace `runyard` passes Pod Security `restricted`; every
    container has requests and limits."""
    namespaces = {d["metadata"]["name"]: d for d in manifests if d["kind"] == "Namespace"}
    labels = namespaces["runyard"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in workloads(manifests):
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) & set(resources["limits"])
        if workload["metadata"]["namespace"] != "runyard":
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}


def test_kubernetes_deployer_is_a_node_agent_with_the_sandbox_privileges(
    manifests: list[dict[str, Any]],
) -> None:
    deployer = k8s_services(manifests)["deployer"]
    assert deployer["metadata"]["namespace"] == "runyard-agents"
    assert deployer["spec"]["updateStrategy"]["type"] == "OnDelete"  # workers die with the Pod
    spec = pod_spec(deployer)
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    context = spec["containers"][0]["securityContext"]
    assert context["privileged"] is False and context["runAsUser"] == 0
    assert set(context["capabilities"]["add"]) == {"SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE"}
    # The API refuses allowPrivilegeEscalation: false beside CAP_SYS_ADMIN.
    assert context.get("allowPrivilegeEscalation") is not False
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    config = next(v for v in spec["volumes"] if v["name"] == "config")
    assert config["configMap"]["name"] == "runyard-deployer-config"


def test_kubernetes_config_is_infra_config(manifests: list[dict[str, Any]]) -> None:
    """config.yaml is what render_config.py makes of infra/config today, and the
    node agents' runtime.yaml differs only in requiring the sandbox."""
    spec = importlib.util.spec_from_file_location("render_config", K8S / "render_config.py")
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    assert (K8S / "config.yaml").read_text() == render.render(), (
        "deploy/kubernetes/config.yaml is stale: run python deploy/kubernetes/render_config.py"
    )
    maps = {d["metadata"]["name"]: d["data"] for d in manifests if d["kind"] == "ConfigMap"}
    ours = yaml.safe_load((REPO / "infra/config/runtime.yaml").read_text())
    theirs = yaml.safe_load(maps["runyard-deployer-config"]["runtime.yaml"])
    ours["local"]["namespaces"] = True
    assert theirs == ours


def test_kubernetes_only_runyard_reaches_postgres_and_kafka(
    manifests: list[dict[str, Any]],
) -> None:
    policies = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
        for d in manifests
        if d["kind"] == "NetworkPolicy"
    }
    for namespace in ("runyard", "runyard-agents"):
        deny = policies[(namespace, "default-deny-ingress")]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}
    for server, port in (("postgres", 5432), ("kafka", 9092)):
        spec = policies[("runyard", f"{server}-from-runyard")]
        assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": server}}
        (rule,) = spec["ingress"]
        assert [p["port"] for p in rule["ports"]] == [port]
        for source in rule["from"]:  # a namespace AND a Runyard Pod, never either alone
            assert set(source) == {"namespaceSelector", "podSelector"}, source
            components = {e["key"]: e["values"] for e in source["podSelector"]["matchExpressions"]}
            assert components["app.kubernetes.io/component"] == ["control-plane", "node-agent"]
            assert components["app.kubernetes.io/part-of"] == ["runyard"]


# --- the same set everywhere, and a missing service is noticed ----------------------


def test_compose_kubernetes_and_code_run_the_same_services(
    compose: dict[str, Any], manifests: list[dict[str, Any]]
) -> None:
    assert code_services() == set(PORTS)
    problems = service_set_problems(
        set(compose_services(compose)), set(k8s_services(manifests)), code_services()
    )
    assert problems == []


@pytest.mark.parametrize("missing", sorted(PORTS))
def test_a_service_left_out_of_a_layout_is_noticed(
    compose: dict[str, Any], manifests: list[dict[str, Any]], missing: str
) -> None:
    """On mutated copies: `missing` dropped from compose, then from Kubernetes."""
    without = copy.deepcopy(compose)
    del without["services"][missing]
    problems = service_set_problems(
        set(compose_services(without)), set(k8s_services(manifests)), code_services()
    )
    assert problems == [f"docker-compose.yml does not run [{missing!r}]"]
    kept = [d for d in manifests if not (d["kind"] in WORKLOADS and served(d) == missing)]
    problems = service_set_problems(
        set(compose_services(compose)), set(k8s_services(kept)), code_services()
    )
    assert problems == [f"deploy/kubernetes does not run [{missing!r}]"]


def test_kubernetes_internal_token_only_where_an_internal_api_is(
    manifests: list[dict[str, Any]],
) -> None:
    holders = {
        name
        for name, workload in k8s_services(manifests).items()
        for container in workload["spec"]["template"]["spec"]["containers"]
        if "RUNYARD_INTERNAL_TOKEN" in env_of(container)
    }
    assert holders == INTERNAL_TOKEN_HOLDERS
