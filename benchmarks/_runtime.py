"""The engine's and the kernels' variables (KERNELS_BACKEND, KERNELS_CPU_NATIVE, ENGINE_CPU_UPCAST_MATMUL, ...)
for the benchmark scripts, which run without Django.

The product reads these in platform_site/settings.py only and hands them to the engine and the kernels as
explicit configuration; a script reads the same variables, with the same meaning, and does the same, so
`KERNELS_BACKEND=ref python benchmarks/engine_offline.py` still measures the references.
"""

from __future__ import annotations

import os


def _value(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def _flag(name: str) -> bool | None:
    value = _value(name)
    return None if value is None else value.lower() not in {"0", "false", "no", "off"}


def runtime_configure_from_env() -> None:
    """Configure the kernels and the CPU matmuls from the environment (unset: their defaults)."""
    try:
        from inference.engine import cpu_matmul
        from kernels.dispatch import configure
    except ImportError:  # a tree from before kernels.config (engine_host_ab.py's baseline) reads them itself
        return
    configure(backend=_value("KERNELS_BACKEND"), cpu_native=_flag("KERNELS_CPU_NATIVE"),
              cache_dir=_value("KERNELS_CACHE_DIR"), cc=_value("CC"), tune_malloc=_flag("KERNELS_TUNE_MALLOC"))
    cpu_matmul.configure(upcast=_value("ENGINE_CPU_UPCAST_MATMUL"), prepack=_flag("ENGINE_CPU_PREPACK"))
