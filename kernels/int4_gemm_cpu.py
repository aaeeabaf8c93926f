"""PyTorch's int4 matmul with its own bits, fast at many rows (``kernels/csrc/int4_gemm.c``).

``int4_matmul(x, packed, scales_zeros)`` is ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32,
scales_zeros)`` for a bf16 ``x`` [rows, K]: the same output bits at every row count. PyTorch's kernel
dequantises each weight again for every 4 rows, which is right for a decode step's few rows and about half
a float32 GEMM's speed per row at 64; the C kernel dequantises a block of columns once per call and runs a
register-blocked GEMM over it, repeating PyTorch's arithmetic exactly (the C file says how). Because the two
agree bit for bit, the call takes PyTorch's kernel below ``NATIVE_MIN_ROWS`` rows and the C kernel from there,
and a row's result never depends on which one ran or on the other rows: the batch-invariant mode multiplies
every int4 layer through it at any row count, and the default mode does on CPUs without 16-bit GEMM hardware
(inference.engine.packed_linear).

Which of PyTorch's builds this process runs (its AVX2 or AVX-512 kernel: other packing, other arithmetic) is
not something torch reports, so ``variant()`` finds out once: it multiplies random weights through both and
keeps the C variant whose every bit matches (several shapes, narrow last blocks, 1-13 rows), or none, and then
this module only ever calls PyTorch's kernel.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from kernels import cpu_native

GROUP = 32
# From this many rows the C kernel is faster than PyTorch's (benchmarks/int4_gemm.py, AMD EPYC Zen 3 AVX2).
NATIVE_MIN_ROWS = 8
_i64, _p = ctypes.c_int64, ctypes.c_void_p
_lock = threading.Lock()
_variant: dict[str, int | None] = {}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.int4_gemm.argtypes = [_p, _p, _p, _p, _i64, _i64, _i64, _i64, _i64, _i64, ctypes.c_int, ctypes.c_int]
    lib.int4_gemm.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    return cpu_native.load_bound(bind)


def _native(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, variant: int,
            group: int = GROUP) -> torch.Tensor:
    rows, k = x.shape
    n = scales_zeros.shape[1]
    out = torch.empty((rows, n), dtype=torch.bfloat16)
    code = lib.int4_gemm(x.data_ptr(), packed.data_ptr(), scales_zeros.data_ptr(), out.data_ptr(), rows, n, k,
                         x.stride(0), n, group, variant, torch.get_num_threads())
    if code == 2:
        raise MemoryError("int4_gemm: out of memory for its float32 panels")
    if code:
        raise ValueError(f"int4_gemm does not take N {n}, K {k}, group {group} (code {code})")
    return out


def _matches(lib: ctypes.CDLL, variant: int) -> bool:
    gen = torch.Generator().manual_seed(7)
    for n, k in ((96, 64), (80, 96), (176, 128), (64, 32)):
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        sz = (torch.randn(k // GROUP, n, 2, generator=gen) * 0.05).to(torch.bfloat16).contiguous()
        for rows in (1, 5, 13):
            x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
            want = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, sz)
            if not torch.equal(_native(lib, x, packed, sz, variant).view(torch.int16), want.view(torch.int16)):
                return False
    return True


def variant() -> int | None:
    """The C kernel's variant that gives this process's PyTorch int4 kernel's bits; None if neither does (or
    the native library or PyTorch's op is missing)."""
    try:
        return _variant["v"]
    except KeyError:
        pass
    with _lock:
        if "v" not in _variant:
            lib = library()
            found = None
            if lib is not None and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
                found = next((v for v in (0, 1) if _matches(lib, v)), None)
            _variant["v"] = found
        return _variant["v"]


def address() -> int:
    """int4_gemm's address in the loaded library (the native decoder stack calls it: kernels/decode_stack_cpu)."""
    return ctypes.cast(library().int4_gemm, ctypes.c_void_p).value


def native_rows(rows: int) -> bool:
    """Whether a call of ``rows`` rows goes to the C kernel."""
    return rows >= NATIVE_MIN_ROWS and variant() is not None


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """x [rows, K] @ the int4 weight, in x's dtype: PyTorch's bits, through the faster kernel for the row count."""
    if x.dtype == torch.bfloat16 and x.dim() == 2 and native_rows(x.shape[0]):
        lib = library()
        if x.stride(1) != 1:
            x = x.contiguous()
        return _native(lib, x, packed, scales_zeros, _variant["v"])
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, GROUP, scales_zeros)
