"""CPU launchers for the fused elementwise ops in ``kernels/csrc/fused_ops.c``.

Same signatures and results as the references in kv_store.py, rms_norm.py,
rotary.py and activation.py. The K/V store and rotary are bit-identical to the
references (any dtype for the store; float32 and bfloat16 for rotary); RMSNorm,
SiLU-and-multiply and GELU(tanh)-and-multiply run natively for bfloat16 only, where they match the
references up to a rare last-bit difference. Other dtypes, devices or shapes
fall back to the references. One C call replaces the 5-12 PyTorch ops of a reference,
which is most of what a small decode step spends outside the matmuls.
"""

from __future__ import annotations

import ctypes

import torch

from kernels import cpu_native
from kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from kernels.kv_store import store_kv_ref
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.rotary import _joint_heads, rotary_embedding_ref

MAX_HIDDEN = 16384  # the C code's per-row buffers
MAX_HEAD_DIM = 1024
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}

_i64, _f32, _int, _p = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "rms_norm_rows": [_p, _p, _p, _p, _p, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _int, _int, _int],
    "rotary_rows": [_p, _p, _p, _p, _i64, _i64, _i64, _i64, _i64, _i64, _int, _int],
    "silu_and_mul_rows": [_p, _p, _i64, _i64, _i64, _i64, _int, _int],
    "gelu_tanh_and_mul_rows": [_p, _p, _i64, _i64, _i64, _i64, _int, _int],
    "store_kv_rows": [_p, _p, _p, _p, _p, _i64, _i64, _i64, _i64, _i64, _i64],
    "argmax_rows": [_p, _i64, _i64, _i64, _p, _int],
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    lib.store_kv_rows.restype = lib.rotary_rows.restype = _i64
    return lib


def library() -> ctypes.CDLL | None:
    """The native library (kernels.cpu_native) with this module's signatures bound; None if unavailable."""
    return cpu_native.load_bound(bind)


def _usable(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """bfloat16 only for the ops whose float32 sums/exp may differ from PyTorch's in the last bit:
    the float32 model stays the exact reference (it is compared with transformers token for token)."""
    if not (x.is_cpu and x.dtype == torch.bfloat16 and x.dim() == 2 and x.stride(1) == 1):
        return False
    for other in others:  # a loop, not all(<generator>): this runs ~100 times a decode step
        if other.dtype != x.dtype or not other.is_cpu:
            return False
    return True


def _norm(x, residual, weight, eps):
    rows, hidden = x.shape
    # empty_like, not torch.empty((rows, hidden), dtype=...), which costs about twice as much per call:
    # at batch 1 each of a step's native calls does so little work that what surrounds it counts
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_res = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None
    weight_f32 = weight.dtype == torch.float32  # Gemma's 1 + weight: one rounding (rms_norm_ref)
    if not (weight_f32 or weight.dtype == x.dtype) or not weight.is_contiguous():
        weight = weight.to(x.dtype).contiguous()
    library().rms_norm_rows(
        x.data_ptr(), residual.data_ptr() if residual is not None else None, weight.data_ptr(),
        out.data_ptr(), new_res.data_ptr() if new_res is not None else None,
        rows, hidden, x.stride(0), residual.stride(0) if residual is not None else 0, hidden, hidden,
        eps, _DTYPES[x.dtype], int(weight_f32), torch.get_num_threads())
    return out, new_res


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if not _usable(x) or x.shape[1] > MAX_HIDDEN or weight.shape != (x.shape[1],):
        return rms_norm_ref(x, weight, eps)
    return _norm(x, None, weight, eps)[0]


def fused_add_rms_norm_cpu(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if (not _usable(x, residual) or residual.shape != x.shape or residual.stride(1) != 1
            or x.shape[1] > MAX_HIDDEN or weight.shape != (x.shape[1],)):
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    return _norm(x, residual, weight, eps)


def _rotate(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    tokens, heads, dim = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    bad = library().rotary_rows(x.data_ptr(), out.data_ptr(), positions.data_ptr(), cos_sin.data_ptr(), tokens,
                                heads, dim, x.stride(0), x.stride(1), cos_sin.shape[0], _DTYPES[x.dtype],
                                torch.get_num_threads())
    if bad:
        raise IndexError(f"rotary position {int(positions[bad - 1])} is outside the cos/sin cache "
                         f"of {cos_sin.shape[0]} positions")
    return out


def rotary_embedding_cpu(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dim = q.shape[-1]
    ok = (q.is_cpu and q.dtype in _DTYPES and k.dtype == q.dtype and q.dim() == 3 and k.dim() == 3
          and q.stride(2) == 1 and k.stride(2) == 1 and dim % 2 == 0 and dim <= MAX_HEAD_DIM
          and k.shape[-1] == dim and positions.dtype == torch.int64 and positions.is_contiguous()
          and cos_sin_cache.dtype == torch.float32 and cos_sin_cache.is_contiguous()
          and cos_sin_cache.shape[-1] == dim and positions.shape[0] == q.shape[0] == k.shape[0])
    if not ok:
        return rotary_embedding_ref(positions, q, k, cos_sin_cache)
    joint = _joint_heads(q, k)
    if joint is not None:
        out = _rotate(joint, positions, cos_sin_cache)
        return out[:, : q.shape[1]], out[:, q.shape[1]:]
    return _rotate(q, positions, cos_sin_cache), _rotate(k, positions, cos_sin_cache)


def _gated(x: torch.Tensor, fn) -> torch.Tensor:
    rows, width = x.shape
    out = x.new_empty((rows, width // 2))
    fn(x.data_ptr(), out.data_ptr(), rows, width // 2, x.stride(0), width // 2, _DTYPES[x.dtype],
       torch.get_num_threads())
    return out


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    if not _usable(x) or x.shape[1] % 2 or x.shape[1] // 2 > MAX_HIDDEN:
        return silu_and_mul_ref(x)
    return _gated(x, library().silu_and_mul_rows)


def gelu_tanh_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    """Same contract as ``gelu_tanh_and_mul_ref`` (bfloat16 natively, up to a rare last-bit difference)."""
    if not _usable(x) or x.shape[1] % 2 or x.shape[1] // 2 > MAX_HIDDEN:
        return gelu_tanh_and_mul_ref(x)
    return _gated(x, library().gelu_tanh_and_mul_rows)


def store_kv_cpu(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Same contract as ``store_kv_ref``: one memcpy per token and cache, padding slots (< 0) skipped."""
    tokens = key.shape[0]
    ok = (key.is_cpu and key.dim() == 3 and value.shape == key.shape and k_cache.dim() == 4
          and k_cache.shape == v_cache.shape and k_cache.is_contiguous() and v_cache.is_contiguous()
          and key.dtype == value.dtype == k_cache.dtype == v_cache.dtype
          and key.shape[1:] == k_cache.shape[2:] and slot_mapping.shape == (tokens,)
          and slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()
          and key.stride(2) == 1 and key.stride(1) == key.shape[2]
          and value.stride(2) == 1 and value.stride(1) == value.shape[2])
    if not ok:
        return store_kv_ref(key, value, k_cache, v_cache, slot_mapping)
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    bad = library().store_kv_rows(key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                  slot_mapping.data_ptr(), tokens, key.shape[1] * key.shape[2], key.stride(0),
                                  value.stride(0), key.element_size(), num_slots)
    if bad:
        raise IndexError(f"{bad} slot(s) out of range for a cache of {num_slots} slots")


def argmax_cpu(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum (int64 [rows]), as ``logits.max(dim=-1).indices`` gives it (a NaN counts as the
    maximum), natively for float32 CPU rows; PyTorch's max with indices scans a row on one thread at a
    twentieth of the speed of its value-only max. Other inputs go to PyTorch."""
    lib = library()
    if (lib is None or logits.dtype != torch.float32 or not logits.is_cpu or logits.dim() != 2
            or logits.stride(1) != 1 or logits.shape[1] == 0):
        return logits.max(dim=-1).indices
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    lib.argmax_rows(logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0), out.data_ptr(),
                    torch.get_num_threads())
    return out
