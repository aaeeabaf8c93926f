"""The kernels' process-wide configuration: which kernel set runs, how the native CPU library is built.

The kernels read nothing from the environment. A server fills this from its
settings (platform_site/settings.py: KERNELS_BACKEND, KERNELS_CPU_NATIVE,
KERNELS_CACHE_DIR, CC, KERNELS_TUNE_MALLOC) through
``kernels.dispatch.configure``; offline users (tests, benchmarks, the engine
used as a library) get the defaults below or call ``configure`` themselves.
The defaults are written here only: a setting left unset (None) keeps them.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("ref", "cpu", "triton")


@dataclass(frozen=True)
class KernelConfig:
    # "auto": Triton on CUDA, the native C kernels on the CPU where they build, else the references;
    # "ref", "cpu" or "triton" force one set (kernels.dispatch.select_backend).
    backend: str = "auto"
    cpu_native: bool = True  # False: never build or load the native CPU library
    cache_dir: Path | None = None  # where the native library is built; None: ~/.cache/llm-platform/kernels
    cc: str | None = None  # C compiler command, flags allowed ("gcc -mno-avx2"); None: cc, gcc or clang
    tune_malloc: bool = True  # False: leave glibc malloc's thresholds alone (kernels.cpu_allocator)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS + ("auto",):
            raise ValueError(f"kernel backend must be one of ref, cpu, triton, auto; got {self.backend!r}")


_lock = threading.Lock()
_current = KernelConfig()


def current() -> KernelConfig:
    return _current


def configure(config: KernelConfig | None = None, **changes) -> KernelConfig:
    """Replace the configuration (`config`, else the current one with `changes` applied; a change
    of None keeps the current value). Returns the previous configuration, so a caller can restore it."""
    global _current
    with _lock:
        previous = _current
        base = config if config is not None else previous
        changes = {name: value for name, value in changes.items() if value is not None}
        if "backend" in changes:
            changes["backend"] = changes["backend"].strip().lower() or "auto"
        if "cache_dir" in changes:
            changes["cache_dir"] = Path(changes["cache_dir"])
        _current = dataclasses.replace(base, **changes)
        return previous
