"""deploy/k8s: each overlay renders (kubectl kustomize), every object is valid offline (Kubernetes 1.32 schemas
through kubernetes-validate, KEDA's vendored CRDs through jsonschema), and the policy checks of k8s_policy hold.
The checker itself is shown to catch a bad manifest. Needs kubectl: skipped without it, failed under CI=true."""

from __future__ import annotations

import copy

import pytest
import yaml

from .k8s_policy import policy_violations
from .k8s_render import K8S, OVERLAYS, rendered, validation_errors, with_components

SECRET_KEYS = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "API_KEY_PEPPER", "METRICS_TOKEN"}


def _of(objects, kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def _containers(objects):
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            pod = obj["spec"]["template"]["spec"]
            for container in pod.get("initContainers", []) + pod["containers"]:
                yield obj, container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid(overlay):
    objects = rendered(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Job", "ScaledObject", "TriggerAuthentication", "NetworkPolicy"} <= kinds
    assert [error for obj in objects for error in validation_errors(obj)] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policies_hold(overlay):
    assert policy_violations(rendered(overlay)) == []


def test_the_policy_checker_flags_a_bad_manifest():
    objects = copy.deepcopy(list(rendered("cpu")))
    (web,) = _of(objects, "Deployment", "web")
    container = web["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "registry.example.com/llm-platform:latest"
    container["securityContext"]["allowPrivilegeEscalation"] = True
    del container["resources"]["limits"]
    container["env"].append({"name": "DATABASE_URL", "value": "postgres://llm:hunter2@db/llm"})
    web["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = False
    del container["securityContext"]["runAsNonRoot"]
    (config,) = _of(objects, "ConfigMap")
    config["data"]["METRICS_TOKEN"] = "abc"
    (beat,) = _of(objects, "Deployment", "beat")
    beat["spec"]["strategy"] = {"type": "RollingUpdate"}
    (worker,) = [o for o in _of(objects, "Deployment") if o["metadata"]["name"].startswith("worker-")]
    worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    worker["spec"]["replicas"] = 1
    (scaled,) = _of(objects, "ScaledObject")
    scaled["spec"]["minReplicaCount"] = 1
    scaled["spec"]["cooldownPeriod"] = 60
    objects.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "oops"}, "stringData": {"a": "b"}})

    found = "\n".join(policy_violations(objects))
    for expected in ("is not pinned", "allowPrivilegeEscalation", "no limits", "DATABASE_URL is a literal",
                     "runAsNonRoot", "secret-looking key METRICS_TOKEN", "beat must be one replica",
                     "terminationGracePeriodSeconds", "sets replicas", "does not scale to zero", "cooldownPeriod",
                     "a Secret in the manifests"):
        assert expected in found, f"not flagged: {expected}\n{found}"


def test_an_invalid_scaledobject_is_refused_by_the_crd_schema():
    (scaled,) = _of(copy.deepcopy(list(rendered("cpu"))), "ScaledObject")
    scaled["spec"]["minReplicas"] = 0  # HPA's name, not KEDA's
    assert any("minReplicas" in error for error in validation_errors(scaled))


def test_secrets_come_from_the_secret_only():
    example = list(yaml.safe_load_all((K8S / "base" / "secret.example.yaml").read_text()))
    keys = {doc["metadata"]["name"]: set(doc["stringData"]) for doc in example}
    assert SECRET_KEYS <= keys["llm-platform-secrets"]
    assert all(validation_errors(doc) == [] for doc in example)
    assert "secret.example" not in (K8S / "base" / "kustomization.yaml").read_text().split("resources:")[1]
    for obj, container in _containers(rendered("gpu")):
        refs = {ref["secretRef"]["name"] for ref in container.get("envFrom", []) if "secretRef" in ref}
        assert refs == {"llm-platform-secrets"}, f"{obj['metadata']['name']}/{container['name']}"
    (auth,) = _of(rendered("gpu"), "TriggerAuthentication")
    assert [(r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]] == [("keda-prometheus", "bearerToken")]
    assert {"bearerToken"} == keys["keda-prometheus"]


@pytest.mark.parametrize("overlay,device", [("cpu", "cpu"), ("gpu", "cuda:0")])
def test_workers_run_their_model_on_the_overlay_device(overlay, device):
    for worker in _of(rendered(overlay), "Deployment"):
        if not worker["metadata"]["name"].startswith("worker-"):
            continue
        model = worker["metadata"]["labels"]["llm-platform/model"]
        pod = worker["spec"]["template"]["spec"]
        command = pod["containers"][0]["command"]
        assert command[:5] == ["python", "manage.py", "run_worker", "--model", model]
        assert command[5:] == ["--device", device, "--metrics-port", "9400", "--metrics-host", "0.0.0.0"]
        assert pod["containers"][0]["readinessProbe"]["exec"]["command"][:3] == ["python", "manage.py", "worker_ready"]
        gpus = pod["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
        assert (gpus == 1 and pod["tolerations"] and pod["nodeSelector"]) if device != "cpu" else gpus is None
        assert {"name": "spool", "mountPath": "/srv/llm-platform/var/spool"} in pod["containers"][0]["volumeMounts"]


def test_the_scaledobject_queries_its_model_demand_and_ttft():
    objects = rendered("cpu")
    (config,) = _of(objects, "ConfigMap")
    for scaled in _of(objects, "ScaledObject"):
        model = scaled["metadata"]["labels"]["llm-platform/model"]
        demand, ttft = scaled["spec"]["triggers"]
        for series in ("llmp:queue_depth", "llmp:requests_waiting_for_worker", "llmp:worker_requests_active"):
            assert f'{series}{{model_name="{model}"}}' in demand["metadata"]["query"]
        assert "or vector(0)" in demand["metadata"]["query"]  # a missing series must not empty the sum
        assert f'time_to_first_token_seconds_bucket{{model_name="{model}"}}' in ttft["metadata"]["query"]
        assert ttft["metricType"] == "Value" and demand["metricType"] == "AverageValue"
        behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
        # a request for a model at zero waits longer than KEDA takes to notice it
        assert float(config["data"]["MODEL_WAIT_S"]) >= 120 > 2 * scaled["spec"]["pollingInterval"]


def test_web_is_served_and_probed_without_depending_on_workers():
    objects = rendered("cpu")
    (web,) = _of(objects, "Deployment", "web")
    container = web["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-1].split("exec ")[1].startswith("python -m uvicorn platform_site.asgi:application")
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"  # not /readyz: workers scale to zero
    assert {"name": "PROMETHEUS_MULTIPROC_DIR", "value": "/srv/llm-platform/metrics"} in container["env"]
    assert _of(objects, "HorizontalPodAutoscaler", "web") and _of(objects, "PodDisruptionBudget", "web")
    assert _of(objects, "Service", "web")[0]["spec"]["ports"][0]["port"] == 8000


def test_network_policies_deny_by_default_and_open_only_what_is_needed():
    policies = {p["metadata"]["name"]: p["spec"] for p in _of(rendered("cpu"), "NetworkPolicy")}
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert policies["default-deny-egress"] == {"podSelector": {}, "policyTypes": ["Egress"]}
    (rule,) = policies["worker-metrics-ingress"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert [peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") for peer in
            rule["from"]] == ["web", None]
    assert rule["from"][1]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    ports = {port["port"] for rule in policies["platform-egress"]["egress"] for port in rule["ports"]}
    assert ports == {53, 5432, 6379, 9400}


def test_jobs_and_singletons():
    objects = rendered("cpu")
    (job,) = _of(objects, "Job", "migrate")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-1] == (
        "python manage.py migrate --noinput && python manage.py bootstrap")
    (runner,) = _of(objects, "Deployment", "batches")
    assert runner["spec"]["template"]["spec"]["containers"][0]["command"] == ["python", "manage.py", "run_batches"]
    assert _of(objects, "Deployment", "celery") and _of(objects, "Deployment", "beat")


def test_a_second_model_component_gets_the_overlay_patches(tmp_path):
    objects = with_components(tmp_path, "gpu", "model-gemma-3-270m", "prometheus-noauth")
    workers = {o["metadata"]["name"]: o for o in _of(objects, "Deployment")
               if o["metadata"]["name"].startswith("worker-")}
    assert set(workers) == {"worker-smollm2-135m-instruct", "worker-gemma-3-270m"}
    assert workers["worker-gemma-3-270m"]["spec"]["template"]["spec"]["containers"][0]["command"][6] == "cuda:0"
    assert not _of(objects, "TriggerAuthentication")
    assert all("authenticationRef" not in t for s in _of(objects, "ScaledObject") for t in s["spec"]["triggers"])
    assert policy_violations(objects) == [] and [e for o in objects for e in validation_errors(o)] == []
