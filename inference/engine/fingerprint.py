"""`system_fingerprint`: what determines an engine's tokens, hashed once at load.

OpenAI's `system_fingerprint` tells a client when the same request and seed
may legitimately give other tokens. Ours hashes everything that decides the
numbers: the weights' identity (each weight file's name, size and
modification time: no read of the weights), the dtype and device, the kernel
set (the backend, and the native CPU library's build identity, which hashes
its sources, compiler and CPU flags; or Triton's version and the GPU), whether
batch-invariant mode is on, and the engine's version (the package version, the
torch version and a hash of the engine's and kernels' Python sources). The
worker sends it with each request's events (inference.protocol), and the API
puts it on every response object.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import metadata
from pathlib import Path

import torch

PREFIX = "fp_"


def weights_identity(path: str | Path) -> list[str]:
    """name:size:mtime_ns of the weight file, or of each file of a weight directory, sorted."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    parts = []
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            parts.append(f"{file.name}:missing")
            continue
        parts.append(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return parts


@cache
def engine_version() -> str:
    """The package version, torch's, and a short hash of the engine's and kernels' sources."""
    try:
        package = metadata.version("llm-platform")
    except metadata.PackageNotFoundError:
        package = "unknown"
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for folder in (root, root.parent.parent / "kernels"):
        for source in sorted(folder.rglob("*")):
            if source.suffix in (".py", ".c", ".h") and "__pycache__" not in source.parts:
                digest.update(source.name.encode())
                digest.update(source.read_bytes())
    return f"{package}+torch{torch.__version__}+src{digest.hexdigest()[:12]}"


def kernel_set(backend: str, device: torch.device) -> str:
    """The kernel set's identity: the backend and what built it."""
    if backend == "cpu":
        from kernels import cpu_native

        return f"cpu:{cpu_native.library_name()}"
    if backend == "triton":
        import triton

        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "interpreter"
        return f"triton:{triton.__version__}:{gpu}"
    return backend


def system_fingerprint(*, weights: str | Path, dtype: torch.dtype, device: torch.device, backend: str,
                       batch_invariant: bool) -> str:
    """fp_ and 12 hex digits of the hash of everything above."""
    parts = [*weights_identity(weights), str(dtype), device.type, kernel_set(backend, device),
             f"batch_invariant={int(batch_invariant)}", engine_version()]
    return PREFIX + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
