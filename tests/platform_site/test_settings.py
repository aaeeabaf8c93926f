"""Settings in one place: platform_site/settings.py is the only reader of the environment."""

import re
from pathlib import Path

import pytest

from platform_site import settings as settings_module

ROOT = Path(__file__).resolve().parents[2]
# Not product code: the tests, and the benchmark scripts (they may read their own variables).
SKIPPED_DIRS = {"tests", "benchmarks", ".venv", "build", "dist", ".git"}
READER = re.compile(r"\bos\.environ\b|\bgetenv\b|\bfrom os import\b.*\benviron\b|\bos\.putenv\b")
# The entry points name the settings module before Django starts (the documented exceptions).
ALLOWED = {
    "platform_site/settings.py": None,  # every line
    "manage.py": 'os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")',
    "platform_site/asgi.py": 'os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")',
    "platform_site/celery.py": 'os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")',
}


def product_files():
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if not SKIPPED_DIRS & set(relative.parts[:-1]) and "site-packages" not in relative.parts:
            yield relative.as_posix(), path


def test_only_settings_read_the_environment():
    found = []
    for name, path in product_files():
        allowed = ALLOWED.get(name, "")
        if allowed is None:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if READER.search(line) and line.strip() != allowed:
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "read the environment in platform_site/settings.py only:\n" + "\n".join(found)


def test_the_scan_sees_the_product_code():
    names = {name for name, _ in product_files()}
    assert {"kernels/dispatch.py", "inference/engine/cpu_matmul.py", "tenants/models.py", "manage.py"} <= names
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


def test_flags_refuse_what_they_cannot_read(monkeypatch):
    monkeypatch.setitem(settings_module.ENV, "ENGINE_CPU_PREPACK", "yes")
    assert settings_module.env_flag("ENGINE_CPU_PREPACK") is True
    monkeypatch.setitem(settings_module.ENV, "ENGINE_CPU_PREPACK", "sometimes")
    with pytest.raises(ValueError, match="ENGINE_CPU_PREPACK must be 0 or 1"):
        settings_module.env_flag("ENGINE_CPU_PREPACK")
    monkeypatch.setitem(settings_module.ENV, "ENGINE_CPU_PREPACK", " ")
    assert settings_module.env_flag("ENGINE_CPU_PREPACK") is None  # blank: the engine's default


def test_engine_knobs_left_unset_keep_the_components_defaults():
    """Each default is written once, in the component: the settings say None when the variable is unset."""
    for name in ("ENGINE_DTYPE", "ENGINE_KV_CACHE_MB", "ENGINE_MAX_NUM_SEQS", "ENGINE_CPU_UPCAST_MATMUL",
                 "ENGINE_CPU_PREPACK", "KERNELS_BACKEND", "KERNELS_CPU_NATIVE", "KERNELS_TUNE_MALLOC"):
        if name not in settings_module.ENV:
            assert getattr(settings_module, name) is None, name
