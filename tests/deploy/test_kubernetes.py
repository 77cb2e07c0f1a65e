"""deploy/kubernetes/ against Kubernetes' own schemas (offline) and against the code's settings: the
names and numbers an operator copies must be the ones the sidecar reads."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from typing import Any

import kubernetes_validate
import pytest

from sie_sidecar import __version__, wire
from sie_sidecar.cli import build_parser
from sie_sidecar.config import LIMITS, RUN_FLAGS
from sie_sidecar.runtime.drain import BACKEND_DRAIN_WAIT_S, shutdown_bound_s

from .manifests import KUBERNETES, PLACEHOLDER, all_documents, container, environment, one, pod_spec, sidecar_settings

K8S_VERSION = "1.30.0"  # native sidecar containers (restartPolicy on an init container) are on by default
#: The backend's own stop once worker-sidecar has exited (the reference backend closes at once).
BACKEND_STOP_ALLOWANCE_S = 10
CRD_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}


@pytest.mark.parametrize(("name", "doc"), list(all_documents()), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_every_document_passes_the_kubernetes_schema(name: str, doc: dict[str, Any]) -> None:
    if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
        pytest.skip("a CRD: checked by test_the_scaled_object_follows_the_lane")
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_misspelled_field() -> None:
    """The check above can fail: strict validation refuses a field the schema does not have."""
    doc = copy.deepcopy(one("Deployment"))
    doc["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_sidecar_environment_builds_supported_settings() -> None:
    settings, _ = sidecar_settings()
    settings.require_supported()
    assert settings.pool == "default" and settings.machine_profile == "l4" and settings.bundle == "default"
    assert settings.nats_user == "sie-worker" and settings.nats_password == PLACEHOLDER
    assert len(settings.nats_servers) == 3
    assert settings.stream_replicas == 3


def test_every_variable_set_is_one_the_code_reads() -> None:
    """A misspelled name would be ignored silently by the sidecar; here it fails."""
    settings, env = sidecar_settings()
    known = env.read | {f.env for f in RUN_FLAGS} | set(LIMITS)
    assert set(env) - known == set()
    assert settings.metrics_enabled


def test_backend_and_sidecar_share_the_socket_on_an_empty_dir() -> None:
    settings, _ = sidecar_settings()
    backend, sidecar = container("backend"), container("worker-sidecar")
    args = [*backend["command"], *backend["args"]]
    socket = args[args.index("--socket") + 1]
    assert socket == settings.ipc_socket_paths[0]
    assert backend["startupProbe"]["exec"]["command"] == ["test", "-S", socket]
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    mounts = [{m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (backend, sidecar)]
    shared = [name for name in mounts[0] if mounts[1].get(name) == mounts[0][name] and "emptyDir" in volumes[name]]
    assert any(socket.startswith(mounts[0][name].rstrip("/") + "/") for name in shared), (socket, shared)


def test_the_backend_stops_after_the_sidecar() -> None:
    """A native sidecar (init container, restartPolicy Always) is stopped after the main containers:
    the backend outlives worker-sidecar's drain."""
    spec = pod_spec()
    assert [c["name"] for c in spec["initContainers"]] == ["backend"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert [c["name"] for c in spec["containers"]] == ["worker-sidecar"]


def test_probes_use_the_port_the_sidecar_serves() -> None:
    settings, _ = sidecar_settings()
    sidecar = container("worker-sidecar")
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"probes": settings.worker_probe_port}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}


def test_readiness_turns_within_the_sidecars_own_stale_window() -> None:
    """The kubelet notices a stale heartbeat no later than twice the window `/readyz` itself uses."""
    settings, _ = sidecar_settings()
    probe = container("worker-sidecar")["readinessProbe"]
    window_s = settings.worker_ping_interval_ms * settings.worker_readyz_stale_mult / 1000.0
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 2 * window_s


def test_termination_grace_covers_the_whole_drain() -> None:
    settings, _ = sidecar_settings()
    bound = shutdown_bound_s(settings)
    assert bound == 87.0  # the figure the manifest's comment and docs/deploying.md quote
    grace = pod_spec()["terminationGracePeriodSeconds"]
    assert grace >= math.ceil(bound) + BACKEND_STOP_ALLOWANCE_S


def test_a_longer_scheduler_drain_needs_a_longer_grace() -> None:
    """The bound follows the setting, so raising SIE_SCHEDULER_DRAIN_DEADLINE_MS without the grace
    fails the test above."""
    settings, _ = sidecar_settings()
    longer = dataclasses.replace(settings, scheduler_drain_deadline_ms=settings.scheduler_drain_deadline_ms + 30_000)
    assert shutdown_bound_s(longer) == shutdown_bound_s(settings) + 30.0


def test_containers_run_as_the_images_numeric_non_root_user() -> None:
    spec = pod_spec()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    for c in [*spec["initContainers"], *spec["containers"]]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
        assert c["image"].rpartition(":")[2] == __version__


def test_secrets_come_from_the_secret_the_example_defines() -> None:
    secret = one("Secret")
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for e in container("worker-sidecar")["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert {r["name"] for r in refs} == {secret["metadata"]["name"]}
    assert {r["key"] for r in refs} == set(secret["stringData"])
    names = {e["name"] for e in container("worker-sidecar")["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert names == {"SIE_NATS_PASSWORD", "SIE_GATEWAY_API_KEY", "SIE_CONFIG_SERVICE_TOKEN"}


def test_the_scaled_object_follows_the_lane() -> None:
    settings, _ = sidecar_settings()
    scaled = one("ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one("Deployment")["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "nats-jetstream"
    meta = trigger["metadata"]
    assert meta["stream"] == wire.pool_stream_name(settings.pool)
    assert meta["consumer"] == wire.pool_durable_name(settings.pool, settings.machine_profile, settings.bundle)
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's trigger metadata is a string map
    assert int(meta["lagThreshold"]) > 0
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]


def test_the_environment_reader_sees_references_as_set() -> None:
    env = environment({"env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {}}}]})
    assert env == {"A": "1", "B": PLACEHOLDER}


def test_the_backend_liveness_asks_the_backend_over_the_sidecars_socket() -> None:
    """A stuck, unhealthy or abandoned-drained backend is restarted (docs/deploying.md): the probe is
    `sie-sidecar probe backend` on the socket the sidecar talks to, and its failures outlast the
    bounded backend drain of a normal shutdown, so a draining backend is never killed mid-drain."""
    settings, _ = sidecar_settings()
    probe = container("backend")["livenessProbe"]
    command = probe["exec"]["command"]
    assert command[:3] == ["sie-sidecar", "probe", "backend"]
    args = build_parser("probe").parse_args(command[1:])
    assert args.path == "backend" and args.socket == settings.ipc_socket_path
    assert args.timeout < probe["timeoutSeconds"]
    assert probe["periodSeconds"] * probe["failureThreshold"] > BACKEND_DRAIN_WAIT_S


def test_the_disruption_budget_covers_the_deployments_pods_one_at_a_time() -> None:
    budget = one("PodDisruptionBudget")
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert selector == one("Deployment")["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]


def test_the_scaled_object_names_the_account_the_worker_user_is_in() -> None:
    """JetStream's monitoring reports streams per account: the trigger's account must be the one the
    worker user logs into (deploy/nats/accounts.conf; tests/integration/test_keda_accounts.py runs it)."""
    settings, _ = sidecar_settings()
    account = one("ScaledObject")["spec"]["triggers"][0]["metadata"]["account"]
    accounts = (KUBERNETES.parent / "nats" / "accounts.conf").read_text()
    block = re.search(rf"\b{re.escape(account)}:\s*{{(.*?)\n  }}", accounts, re.S)
    assert block is not None, f"account {account} is not in deploy/nats/accounts.conf"
    assert re.search(rf"\buser:\s*{re.escape(str(settings.nats_user))}\b", block.group(1))
    assert "jetstream: enabled" in block.group(1)
