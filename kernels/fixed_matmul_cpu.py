"""The batch-invariant matmul on the CPU (``kernels/csrc/fixed_matmul.c``).

``fixed_matmul_cpu(x, weight)`` is ``x @ weight.T`` for float32 or bfloat16 ``x`` [rows, K] and ``weight``
[N, K], accumulated in float32 and rounded once to ``out_dtype`` (x's dtype by default). Unlike a library
GEMM, each output element is reduced in one fixed order whatever the number of rows in the call, their
place in it and the thread count, so a row's result is bit-for-bit the same alone or beside any other
rows: the engine's batch-invariant mode (``inference.engine.invariant_mode``) multiplies every weight
with it. ``kernels.fixed_matmul.fixed_matmul_ref`` is the same product in plain PyTorch (equal up to
summation order).
"""

from __future__ import annotations

import ctypes

import torch

from kernels import cpu_native

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_i64, _p = ctypes.c_int64, ctypes.c_void_p


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.fixed_matmul.argtypes = [_p, _p, _p, _i64, _i64, _i64, _i64, _i64, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_int]
    lib.fixed_matmul.restype = ctypes.c_int
    lib.fixed_matmul_isa.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The native library with this module's signatures bound; None if unavailable."""
    return cpu_native.load_bound(bind)


def available() -> bool:
    return library() is not None


def isa() -> str:
    """The instruction set the loops were built for (the build's library name, in the engine's fingerprint,
    already follows it)."""
    lib = library()
    return "none" if lib is None else {2: "avx512", 1: "avx2"}.get(lib.fixed_matmul_isa(), "portable")


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be [rows, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")


def fixed_matmul_cpu(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """[rows, N] in ``out_dtype`` (default x's). Raises where the native kernel cannot run: a batch-invariant
    engine must not fall back silently to a shape-dependent GEMM."""
    _check(x, weight)
    out_dtype = out_dtype or x.dtype
    lib = library()
    if lib is None:
        raise RuntimeError("the batch-invariant matmul needs the native CPU kernels (kernels.cpu_native)")
    if x.dtype not in _DTYPES or weight.dtype not in _DTYPES or out_dtype not in _DTYPES:
        raise ValueError(f"fixed_matmul_cpu takes float32/bfloat16, got {x.dtype}, {weight.dtype} -> {out_dtype}")
    if not (x.is_cpu and weight.is_cpu):
        raise ValueError("fixed_matmul_cpu takes CPU tensors")
    if x.stride(1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    rows, (n, k) = x.shape[0], weight.shape
    out = torch.empty((rows, n), dtype=out_dtype)
    code = lib.fixed_matmul(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, k, x.stride(0), n,
                            _DTYPES[x.dtype], _DTYPES[weight.dtype], _DTYPES[out_dtype], torch.get_num_threads())
    if code == 2:
        raise MemoryError("fixed_matmul: out of memory for the float32 copy of x")
    if code:
        raise ValueError(f"fixed_matmul failed with code {code}")
    return out
