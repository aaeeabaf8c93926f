"""The one seam between model code and kernels.

``get_ops(device)`` returns the Triton launchers on CUDA devices (when Triton
imports and ``KERNELS_BACKEND`` is not ``ref``) and the PyTorch references,
which are the CPU production path, otherwise. ``KERNELS_BACKEND=triton``
forces Triton (tests pair it with ``TRITON_INTERPRET=1`` on the CPU).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable

import torch

BACKEND_ENV = "KERNELS_BACKEND"
BACKENDS = ("ref", "triton")


@dataclass(frozen=True)
class Ops:
    backend: str
    store_kv: Callable
    paged_decode_attention: Callable
    paged_prefill_attention: Callable
    rms_norm: Callable
    fused_add_rms_norm: Callable
    rotary_embedding: Callable
    silu_and_mul: Callable
    build_cos_sin_cache: Callable


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install raising at import time
        return False
    return True


def select_backend(device: torch.device | str) -> str:
    """'triton' or 'ref' for ``device`` under the current environment."""
    device = torch.device(device)
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced and forced not in BACKENDS + ("auto",):
        raise ValueError(f"{BACKEND_ENV} must be one of ref, triton, auto; got {forced!r}")
    if forced == "ref":
        return "ref"
    if forced == "triton":
        if not triton_available():
            raise RuntimeError(f"{BACKEND_ENV}=triton but triton cannot be imported")
        return "triton"
    return "triton" if device.type == "cuda" and triton_available() else "ref"


@functools.cache
def _ops(backend: str) -> Ops:
    from kernels.rotary import build_cos_sin_cache

    if backend == "triton":
        from kernels.activation import silu_and_mul
        from kernels.kv_store import store_kv
        from kernels.paged_decode_attention import paged_decode_attention
        from kernels.prefill_attention import paged_prefill_attention
        from kernels.rms_norm import fused_add_rms_norm, rms_norm
        from kernels.rotary import rotary_embedding

        return Ops(
            backend, store_kv, paged_decode_attention, paged_prefill_attention,
            rms_norm, fused_add_rms_norm, rotary_embedding, silu_and_mul,
            build_cos_sin_cache,
        )
    from kernels.activation import silu_and_mul_ref
    from kernels.kv_store import store_kv_ref
    from kernels.paged_decode_attention import paged_decode_attention_ref
    from kernels.prefill_attention import paged_prefill_attention_ref
    from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
    from kernels.rotary import rotary_embedding_ref

    return Ops(
        backend, store_kv_ref, paged_decode_attention_ref, paged_prefill_attention_ref,
        rms_norm_ref, fused_add_rms_norm_ref, rotary_embedding_ref, silu_and_mul_ref,
        build_cos_sin_cache,
    )


def get_ops(device: torch.device | str) -> Ops:
    """The kernel set for ``device`` (see the module docstring).

    Choosing the reference backend for a CPU device also tunes glibc malloc for
    the step loop (``kernels.cpu_allocator``; KERNELS_TUNE_MALLOC=0 opts out).
    """
    device = torch.device(device)
    backend = select_backend(device)
    if backend == "ref" and device.type == "cpu":
        from kernels.cpu_allocator import tune_cpu_allocator

        tune_cpu_allocator()
    return _ops(backend)
