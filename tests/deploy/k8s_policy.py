"""Policy checks over rendered Kubernetes objects, in plain Python: `policy_violations(objects)` lists what
breaks the platform's rules (deploy/docs/kubernetes.md), [] when nothing does."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

# names of settings that hold secrets: never a literal `value`, never in a ConfigMap
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|PEPPER|(^|_)KEY$|^(DATABASE|REDIS|CELERY_BROKER)_URL$", re.I)
CREDENTIALS_IN_URL = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
DEFAULT_ADMISSION_HOLD_S = 900.0  # platform_site/settings.py's default, when the ConfigMap does not set it


def _name(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def _containers(pod: dict) -> Iterator[dict]:
    yield from pod.get("initContainers", [])
    yield from pod.get("containers", [])


def _container_violations(where: str, pod: dict, container: dict) -> Iterator[str]:
    pod_sc, sc = pod.get("securityContext", {}), container.get("securityContext", {})
    where = f"{where} container {container['name']}"
    if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        yield f"{where}: runAsNonRoot is not true"
    if sc.get("runAsUser", pod_sc.get("runAsUser")) != 10001:
        yield f"{where}: runAsUser is not 10001"
    if sc.get("allowPrivilegeEscalation") is not False:
        yield f"{where}: allowPrivilegeEscalation is not false"
    if sc.get("readOnlyRootFilesystem") is not True:
        yield f"{where}: readOnlyRootFilesystem is not true"
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        yield f"{where}: capabilities do not drop ALL"
    if sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type") != "RuntimeDefault":
        yield f"{where}: seccompProfile is not RuntimeDefault"
    resources = container.get("resources", {})
    for part in ("requests", "limits"):
        missing = {"cpu", "memory"} - set(resources.get(part, {}))
        if missing:
            yield f"{where}: no {part} for {sorted(missing)}"
    image = container.get("image", "")
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    if "@sha256:" not in image and (not tag or tag == "latest"):
        yield f"{where}: image {image!r} is not pinned (a tag other than latest, or a digest)"
    for env in container.get("env", []):
        if SECRET_NAME.search(env["name"]) and "value" in env:
            yield f"{where}: secret-looking {env['name']} is a literal value (use a secretKeyRef)"
        elif CREDENTIALS_IN_URL.search(str(env.get("value", ""))):
            yield f"{where}: {env['name']} carries credentials in a literal URL"


def _configmap_violations(obj: dict) -> Iterator[str]:
    for key, value in (obj.get("data") or {}).items():
        if SECRET_NAME.search(key):
            yield f"{_name(obj)}: secret-looking key {key} in a ConfigMap"
        elif CREDENTIALS_IN_URL.search(str(value)):
            yield f"{_name(obj)}: {key} carries credentials in a URL"


def _startup_budget_s(pod: dict) -> float:
    """The longest the kubelet lets a worker's startupProbe fail (its model loading) before restarting it."""
    probe = next(_containers(pod)).get("startupProbe") or {}
    return (probe.get("initialDelaySeconds", 0)
            + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


def _admission_hold_s(objects: list[dict]) -> float:
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "ADMISSION_HOLD_S" in (obj.get("data") or {}):
            return float(obj["data"]["ADMISSION_HOLD_S"])
    return DEFAULT_ADMISSION_HOLD_S


def _is_component(obj: dict, component: str) -> bool:
    labels = obj["spec"]["template"]["metadata"].get("labels", {})
    return labels.get("app.kubernetes.io/component") == component


def _worker_violations(objects: list[dict], worker: dict) -> Iterator[str]:
    pod, name = _pod_spec(worker), _name(worker)
    hold = _admission_hold_s(objects)
    if pod.get("terminationGracePeriodSeconds", 30) <= hold:
        yield f"{name}: terminationGracePeriodSeconds is not above the longest request (ADMISSION_HOLD_S {hold:g})"
    container = next(_containers(pod))
    if "readinessProbe" not in container or "startupProbe" not in container:
        yield f"{name}: no readinessProbe/startupProbe"
    scaled = [o for o in objects if o["kind"] == "ScaledObject"
              and o["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]]
    if len(scaled) != 1:
        yield f"{name}: {len(scaled)} ScaledObjects target it (one expected)"
        return
    spec = scaled[0]["spec"]
    if spec.get("minReplicaCount", 0) != 0:
        yield f"{name}: its ScaledObject does not scale to zero (minReplicaCount {spec.get('minReplicaCount')})"
    if spec.get("cooldownPeriod", 300) <= _startup_budget_s(pod):
        yield f"{name}: cooldownPeriod {spec.get('cooldownPeriod', 300)} is not above the startup probe budget"
    if not any("activationThreshold" in t.get("metadata", {}) for t in spec["triggers"]):
        yield f"{name}: no trigger has an activationThreshold"


def _scaled_targets(objects: list[dict]) -> set[str]:
    targets = {o["spec"]["scaleTargetRef"]["name"] for o in objects if o["kind"] in ("ScaledObject",
                                                                                        "HorizontalPodAutoscaler")}
    return targets


def policy_violations(objects: Iterable[dict]) -> list[str]:
    objects = list(objects)
    found: list[str] = []
    scaled = _scaled_targets(objects)
    for obj in objects:
        if obj["kind"] == "Secret":
            found.append(f"{_name(obj)}: a Secret in the manifests (create it by hand: secret.example.yaml)")
        if obj["kind"] == "ConfigMap":
            found.extend(_configmap_violations(obj))
        if obj["kind"] not in WORKLOADS:
            continue
        pod = _pod_spec(obj)
        for container in _containers(pod):
            found.extend(_container_violations(_name(obj), pod, container))
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] in scaled and "replicas" in obj["spec"]:
            found.append(f"{_name(obj)}: sets replicas although an autoscaler owns them (each apply would reset it)")
        if obj["kind"] == "Deployment" and _is_component(obj, "worker"):
            found.extend(_worker_violations(objects, obj))
        if obj["kind"] == "Deployment" and _is_component(obj, "beat"):
            if obj["spec"].get("replicas", 1) != 1 or obj["spec"].get("strategy", {}).get("type") != "Recreate":
                found.append(f"{_name(obj)}: beat must be one replica with strategy Recreate")
    return found
