"""The one seam between model code and kernels.

``get_ops(device)`` returns one of three kernel sets:

- ``triton``: the Triton launchers; the default on CUDA devices when Triton
  imports. ``configure(backend="triton")`` forces it (tests pair it with
  ``TRITON_INTERPRET=1`` on the CPU).
- ``cpu``: native C decode attention (``kernels.paged_decode_attention_cpu``)
  and fused small ops (``kernels.fused_ops_cpu``: K/V store, RMSNorm, rotary,
  SiLU-and-multiply), the references for the rest (prefill attention, and the
  inputs the native code does not take); the default on CPU devices when the
  native library builds (``kernels.cpu_native``; ``configure(cpu_native=False)``
  turns it off).
- ``ref``: the PyTorch references only; the fallback everywhere else, and what
  ``configure(backend="ref")`` forces.

The choice follows ``kernels.config`` (``configure`` is re-exported here); a
server fills it from its settings (KERNELS_BACKEND, KERNELS_CPU_NATIVE, ...).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from kernels.config import BACKENDS, KernelConfig, configure, current

__all__ = ["BACKENDS", "KernelConfig", "Ops", "configure", "get_ops", "select_backend"]


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
    # rotary_embedding on q and k, then store_kv of the rotated k and v, as one op (one kernel on Triton)
    rotary_and_store_kv: Callable
    # The batch-invariant mode's two ops (inference/engine/invariant_mode.py): x @ weight.T with one
    # reduction order per output whatever the row count (kernels.fixed_matmul, fixed_matmul_cpu), and
    # attention one query row at a time (kernels.row_attention).
    fixed_matmul: Callable
    paged_attention_rows: Callable
    # Gemma's GELU(tanh)-and-multiply: native on the CPU backend, the PyTorch reference elsewhere
    gelu_tanh_and_mul: Callable


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install raising at import time
        return False
    return True


def native_cpu_available() -> bool:
    from kernels import cpu_native

    return cpu_native.available()


def select_backend(device: torch.device | str) -> str:
    """'triton', 'cpu' or 'ref' for ``device`` under the current configuration (kernels.config)."""
    device = torch.device(device)
    forced = current().backend
    if forced == "ref":
        return "ref"
    if forced == "triton":
        if not triton_available():
            raise RuntimeError("kernel backend triton is configured but triton cannot be imported")
        return "triton"
    if forced == "cpu":
        if device.type != "cpu":
            raise ValueError(f"kernel backend cpu runs on CPU devices only, not {device}")
        if not native_cpu_available():
            raise RuntimeError("kernel backend cpu is configured but the native CPU kernels did not build (see the log)")
        return "cpu"
    if device.type == "cuda" and triton_available():
        return "triton"
    if device.type == "cpu" and native_cpu_available():
        return "cpu"
    return "ref"


@functools.cache
def _ops(backend: str) -> Ops:
    from kernels.activation import gelu_tanh_and_mul_ref
    from kernels.rotary import build_cos_sin_cache

    if backend == "triton":
        from kernels.activation import silu_and_mul
        from kernels.fixed_matmul import fixed_matmul
        from kernels.kv_store import store_kv
        from kernels.paged_decode_attention import paged_decode_attention
        from kernels.prefill_attention import paged_prefill_attention
        from kernels.rms_norm import fused_add_rms_norm, rms_norm
        from kernels.rotary import rotary_embedding
        from kernels.row_attention import paged_attention_rows_triton
        from kernels.rotary_kv_store import rotary_and_store_kv

        return Ops(
            backend, store_kv, paged_decode_attention, paged_prefill_attention,
            rms_norm, fused_add_rms_norm, rotary_embedding, silu_and_mul,
            build_cos_sin_cache, rotary_and_store_kv, fixed_matmul, paged_attention_rows_triton,
            gelu_tanh_and_mul_ref,
        )
    from kernels.activation import silu_and_mul_ref
    from kernels.fixed_matmul import fixed_matmul_rows
    from kernels.kv_store import store_kv_ref
    from kernels.paged_decode_attention import paged_decode_attention_ref
    from kernels.prefill_attention import paged_prefill_attention_ref
    from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
    from kernels.rotary import rotary_embedding_ref
    from kernels.row_attention import paged_attention_rows_cpu, paged_attention_rows_ref
    from kernels.rotary_kv_store import rotary_and_store_kv_ref, rotary_then_store

    if backend == "cpu":
        from kernels import fused_ops_cpu as fused
        from kernels.fixed_matmul_cpu import fixed_matmul_cpu
        from kernels.paged_decode_attention_cpu import paged_decode_attention_cpu

        return Ops(
            backend, fused.store_kv_cpu, paged_decode_attention_cpu, paged_prefill_attention_ref,
            fused.rms_norm_cpu, fused.fused_add_rms_norm_cpu, fused.rotary_embedding_cpu, fused.silu_and_mul_cpu,
            build_cos_sin_cache, rotary_then_store(fused.rotary_embedding_cpu, fused.store_kv_cpu),
            fixed_matmul_cpu, paged_attention_rows_cpu, fused.gelu_tanh_and_mul_cpu,
        )
    return Ops(
        backend, store_kv_ref, paged_decode_attention_ref, paged_prefill_attention_ref,
        rms_norm_ref, fused_add_rms_norm_ref, rotary_embedding_ref, silu_and_mul_ref,
        build_cos_sin_cache, rotary_and_store_kv_ref, fixed_matmul_rows, paged_attention_rows_ref,
        gelu_tanh_and_mul_ref,
    )


def get_ops(device: torch.device | str) -> Ops:
    """The kernel set for ``device`` (see the module docstring).

    Choosing a CPU backend (``cpu`` or ``ref``) for a CPU device also tunes glibc
    malloc for the step loop (``kernels.cpu_allocator``; ``configure(tune_malloc=False)``
    opts out).
    """
    device = torch.device(device)
    backend = select_backend(device)
    if backend in ("ref", "cpu") and device.type == "cpu":
        from kernels.cpu_allocator import tune_cpu_allocator

        tune_cpu_allocator()
    return _ops(backend)
