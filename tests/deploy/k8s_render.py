"""Render deploy/k8s with `kubectl kustomize` and validate the objects offline (Kubernetes and KEDA schemas)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")
KUBERNETES_VERSION = "1.32.0"  # kubernetes-validate ships its schemas; kubectl here is v1.32
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KEDA_CRDS = {"ScaledObject": "keda.sh_scaledobjects.yaml",
             "TriggerAuthentication": "keda.sh_triggerauthentications.yaml"}


def kubectl() -> str:
    """kubectl's path; without it the test is skipped, except under CI=true where that is a failure."""
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is missing: the Kubernetes manifests cannot be rendered (CI=true never skips)")
        pytest.skip("kubectl is not installed")
    return path


def kustomize(directory: Path, *extra: str) -> list[dict]:
    out = subprocess.run([kubectl(), "kustomize", *extra, str(directory)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, f"kubectl kustomize {directory} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@functools.cache
def rendered(overlay: str) -> tuple[dict, ...]:
    return tuple(kustomize(K8S / "overlays" / overlay))


def with_components(tmp_path: Path, overlay: str, *components: str) -> list[dict]:
    """An overlay as an operator extends it: its kustomization.yaml plus `components:`, rendered from tmp_path."""
    source = K8S / "overlays" / overlay
    up = Path(os.path.relpath(K8S, tmp_path))
    text = (source / "kustomization.yaml").read_text().replace("../../base", str(up / "base"))
    for patch in source.glob("*.yaml"):
        if patch.name != "kustomization.yaml":
            text = text.replace(f"path: {patch.name}", f"path: {up / 'overlays' / overlay / patch.name}")
    text += "components:\n" + "".join(f"  - {up / 'components' / name}\n" for name in components)
    (tmp_path / "kustomization.yaml").write_text(text)
    return kustomize(tmp_path, "--load-restrictor", "LoadRestrictionsNone")


def strict(schema: dict) -> dict:
    """The CRD schema with unknown fields refused (additionalProperties false wherever properties are listed
    and unknown fields are not preserved), as the API server's strict field validation refuses them."""
    schema = dict(schema)
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema.setdefault("additionalProperties", False)
        schema["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict(schema[key])
    return schema


@functools.cache
def keda_schema(kind: str) -> dict:
    crd = yaml.safe_load((SCHEMAS / KEDA_CRDS[kind]).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's own, checked below
    return schema


def validation_errors(obj: dict) -> list[str]:
    """Every schema error of one rendered object: KEDA's kinds against the vendored CRDs, the rest against
    kubernetes-validate's schemas of KUBERNETES_VERSION (strict)."""
    import jsonschema
    import kubernetes_validate

    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if obj.get("kind") in KEDA_CRDS:
        validator = jsonschema.Draft7Validator(keda_schema(obj["kind"]))
        return [f"{name}: {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{name}: {'/'.join(map(str, exc.path))}: {exc.message}"]
    except Exception as exc:  # noqa: BLE001 - SchemaNotFoundError and the like: an unknown kind is an error too
        return [f"{name}: {type(exc).__name__}: {exc}"]
    return []
