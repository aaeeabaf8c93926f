"""`system_fingerprint`: what determines an engine's tokens, hashed once at load.

OpenAI's `system_fingerprint` tells a client when the same request and seed
may legitimately give other tokens. Ours hashes everything that decides the
numbers: the weights' identity (each weight file's name, size and a hash of
its first and last MiB), the dtype and device, the kernel set (the backend,
and the native CPU library's build identity, which hashes its sources,
compiler and CPU flags, or the CPU's flags for torch's own kernels, and
torch's thread count outside batch-invariant mode; or Triton's version and the
GPU), whether
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


SAMPLE_BYTES = 1 << 20  # of each weight file, read from its start (a GGUF's header and tensor table) and its end


def weights_identity(path: str | Path) -> list[str]:
    """name:size:hash of the first and last MiB, of the weight file or of each file of a weight directory,
    sorted. Content, not a modification time: the same weights copied to another host (or rewritten with
    their old mtime kept) keep (or change) their identity as their bytes do, without reading them all."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    parts = []
    for file in files:
        try:
            size = file.stat().st_size
            digest = hashlib.sha256()
            with open(file, "rb") as f:
                digest.update(f.read(SAMPLE_BYTES))
                if size > SAMPLE_BYTES:
                    f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                    digest.update(f.read(SAMPLE_BYTES))
        except OSError:
            parts.append(f"{file.name}:missing")
            continue
        parts.append(f"{file.name}:{size}:{digest.hexdigest()[:16]}")
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


def kernel_set(backend: str, device: torch.device, *, batch_invariant: bool = False) -> str:
    """The kernel set's identity: the backend and what built it, the GPU, and on the CPU torch's threads
    (its own GEMMs split their sums by thread; batch-invariant mode's do not)."""
    if backend == "triton":
        import triton

        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "interpreter"
        return f"triton:{triton.__version__}:{gpu}"
    if device.type == "cuda":
        return f"{backend}:{torch.cuda.get_device_name(device)}"
    from kernels import cpu_native

    threads = "" if batch_invariant else f":threads={torch.get_num_threads()}"
    if backend == "cpu":  # the library's name hashes its sources, compiler and the CPU's flags
        return f"cpu:{cpu_native.library_name()}{threads}"
    flags = hashlib.sha256(cpu_native._cpu_flags().encode()).hexdigest()[:12]
    return f"{backend}:cpu-flags={flags}{threads}"  # torch's kernels: what they pick depends on the CPU


def system_fingerprint(*, weights: str | Path, dtype: torch.dtype, device: torch.device, backend: str,
                       batch_invariant: bool) -> str:
    """fp_ and 12 hex digits of the hash of everything above."""
    parts = [*weights_identity(weights), str(dtype), device.type,
             kernel_set(backend, device, batch_invariant=batch_invariant),
             f"batch_invariant={int(batch_invariant)}", engine_version()]
    return PREFIX + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
