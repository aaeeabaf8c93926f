"""Matmul with a weight held as 8-bit blocks (GGUF Q8_0, Q5_0, Q4_0, Q6_K) on the CPU (``kernels/csrc/q8_matmul.c``).

``weight[n, k] = codes[n, k] * scales[n, k // block]``: int8 codes [N, K] and float32 scales [N, K / block],
the block (32 for Q8_0/Q5_0/Q4_0, 16 for Q6_K's sub-blocks) read from the shapes. ``q8_matmul_cpu(x,
codes, scales)`` returns the float32 product ``x @ weight.T`` ([rows, N]) for bfloat16 or float32 ``x``
[rows, K], computed in float32 from the exact weights (up to summation order); with ``out_dtype=
torch.bfloat16`` that float32 sum comes back rounded once to bf16 (what ``.to(torch.bfloat16)`` of the
float32 result gives, without the extra op). ``q8_matmul_ref`` is the same in plain PyTorch. It reads
about half the bytes of a bfloat16 weight, so for the few rows of a decode step (a tied-embedding LM head
at batch 1-8, a layer at 1-4) it beats the dense GEMV; the C code holds up to 8 rows per pass over the weight.
From ``GEMM_MIN_ROWS`` rows, AVX2 builds take ``kernels/csrc/q8_gemm.c`` instead: the same bits (each output's
sums in the same order), a dequantised panel reused across all rows, ~2.3x faster at 64 rows (the
batch-invariant mode's LM head at a 64-sequence decode step).

``q5_matmul_cpu(x, blocks)`` is the same product for a Q5_0 weight held as the GGUF file's own bytes ([N,
K / 32 * 22] uint8: fp16 d, 32 high bits, 16 bytes of nibbles a block), 40% fewer bytes than its int8 form,
with the very bits of ``q8_matmul_cpu`` on that int8 form. Only AVX-512 builds have its loop
(``q5_supported()``); elsewhere the weight is kept as int8 blocks.
"""

from __future__ import annotations

import ctypes

import torch

from kernels import cpu_native

BLOCK = 32  # Q8_0's (the default in tests and docs)
BLOCKS = (16, 32)  # what the C code takes
# From this many rows the product goes to kernels/csrc/q8_gemm.c (same bits, a float32 panel per 48 channels;
# AVX2 builds only). SmolLM2's LM head, one thread, AMD EPYC Zen 3: 4 rows 10.2 ms (q8_matmul) vs 11.6, 6 rows
# 19.7 vs 16.1, 64 rows 156 vs 68 (the dense float32 GEMM: 56).
GEMM_MIN_ROWS = 5
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_i64, _p = ctypes.c_int64, ctypes.c_void_p


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.q8_matmul.argtypes = [_p, _p, _p, _p, _i64, _i64, _i64, _i64, _i64, ctypes.c_int, ctypes.c_int, _i64,
                              ctypes.c_int]
    lib.q8_matmul.restype = ctypes.c_int
    lib.q8_matmul_isa.restype = ctypes.c_int
    lib.q5_matmul.argtypes = [_p, _p, _p, _i64, _i64, _i64, _i64, _i64, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.q5_matmul.restype = ctypes.c_int
    lib.q8_gemm.argtypes = lib.q8_matmul.argtypes
    lib.q8_gemm.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The native library (kernels.cpu_native) with this module's signatures bound; None if unavailable."""
    return cpu_native.load_bound(bind)


def block_of(codes: torch.Tensor, scales: torch.Tensor) -> int:
    """The block size the shapes imply: K / scales per row (0 when they do not divide)."""
    k, groups = codes.shape[-1], scales.shape[-1]
    return k // groups if groups and k % groups == 0 else 0


def q8_dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] the blocks stand for."""
    n, k = codes.shape
    block = block_of(codes, scales)
    return (codes.float().view(n, k // block, block) * scales.unsqueeze(-1)).view(n, k)


def _check(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    if x.dim() != 2 or codes.dim() != 2 or scales.dim() != 2:
        raise ValueError(f"x, codes and scales must be 2-D, got {tuple(x.shape)}, {tuple(codes.shape)}, "
                         f"{tuple(scales.shape)}")
    n, k = codes.shape
    block = block_of(codes, scales)
    if block not in BLOCKS:
        raise ValueError(f"K must be a multiple of the block, which must be one of {BLOCKS}: K {k}, "
                         f"{scales.shape[-1]} scales per row")
    if x.shape[1] != k or scales.shape[0] != n:
        raise ValueError(f"shapes do not match: x {tuple(x.shape)}, codes {tuple(codes.shape)}, "
                         f"scales {tuple(scales.shape)} (want [rows, K], [N, K], [N, K/block])")
    if codes.dtype != torch.int8 or scales.dtype != torch.float32:
        raise ValueError(f"codes must be int8 and scales float32, got {codes.dtype} and {scales.dtype}")


def q8_matmul_ref(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    _check(x, codes, scales)
    return (x.float() @ q8_dequantize(codes, scales).t()).to(out_dtype)


def q8_matmul_cpu(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, N] in ``out_dtype`` (float32 or bfloat16); the reference when the library is unavailable or x
    is not bf16/fp32 on the CPU."""
    _check(x, codes, scales)
    lib = library()
    if (lib is None or x.dtype not in _DTYPES or out_dtype not in _DTYPES
            or not (x.is_cpu and codes.is_cpu and scales.is_cpu)):
        return q8_matmul_ref(x, codes, scales, out_dtype)
    if x.stride(1) != 1:
        x = x.contiguous()
    codes, scales = codes.contiguous(), scales.contiguous()
    rows, (n, k) = x.shape[0], codes.shape
    out = torch.empty((rows, n), dtype=out_dtype)
    args = (x.data_ptr(), codes.data_ptr(), scales.data_ptr(), out.data_ptr(), rows, n, k, x.stride(0), n,
            _DTYPES[x.dtype], _DTYPES[out_dtype], k // scales.shape[1], torch.get_num_threads())
    code = lib.q8_gemm(*args) if rows >= GEMM_MIN_ROWS else 3
    if code == 3:  # few rows, or a build without the GEMM's loop
        code = lib.q8_matmul(*args)
    if code == 2:
        raise MemoryError("q8_matmul: out of memory for the float32 copy of x")
    if code:
        raise ValueError(f"q8_matmul failed with code {code}")
    return out


Q5_BYTES = 22  # a Q5_0 block of 32 values: fp16 d, uint32 qh, 16 bytes of nibbles


def q5_supported() -> bool:
    """Whether this build multiplies Q5_0 blocks natively (AVX-512); else callers keep them as int8 blocks."""
    lib = library()
    return lib is not None and lib.q8_matmul_isa() == 2


def q5_to_int8(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 codes [N, K] and float32 scales [N, K / 32] of Q5_0 blocks [N, K / 32 * 22] (the reference)."""
    n = blocks.shape[0]
    raw = blocks.reshape(-1, Q5_BYTES)
    scales = raw[:, 0:2].clone(memory_format=torch.contiguous_format).view(torch.float16).float().view(n, -1)
    qh = raw[:, 2:6].clone(memory_format=torch.contiguous_format).view(torch.int32).view(-1, 1)
    bits = ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.int16)
    qs = raw[:, 6:].to(torch.int16)
    low = torch.cat((qs & 15, qs >> 4), dim=1)
    codes = (low | (bits << 4)) - 16
    return codes.to(torch.int8).view(n, -1), scales


def q5_matmul_cpu(x: torch.Tensor, blocks: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [rows, K] @ the Q5_0 weight.T -> [rows, N] in ``out_dtype``; through the int8 reference where the
    native loop cannot run."""
    if x.dim() != 2 or blocks.dim() != 2 or blocks.dtype != torch.uint8 or blocks.shape[1] % Q5_BYTES:
        raise ValueError(f"x must be [rows, K] and blocks uint8 [N, K / 32 * {Q5_BYTES}], got {tuple(x.shape)}, "
                         f"{tuple(blocks.shape)} {blocks.dtype}")
    n, k = blocks.shape[0], blocks.shape[1] // Q5_BYTES * 32
    if x.shape[1] != k:
        raise ValueError(f"shapes do not match: x {tuple(x.shape)} against K {k}")
    lib = library()
    if (lib is None or not q5_supported() or x.dtype not in _DTYPES or out_dtype not in _DTYPES
            or not (x.is_cpu and blocks.is_cpu)):
        codes, scales = q5_to_int8(blocks)
        return q8_matmul_cpu(x, codes, scales, out_dtype)
    if x.stride(1) != 1:
        x = x.contiguous()
    blocks = blocks.contiguous()
    out = torch.empty((x.shape[0], n), dtype=out_dtype)
    code = lib.q5_matmul(x.data_ptr(), blocks.data_ptr(), out.data_ptr(), x.shape[0], n, k, x.stride(0), n,
                         _DTYPES[x.dtype], _DTYPES[out_dtype], torch.get_num_threads())
    if code == 2:
        raise MemoryError("q5_matmul: out of memory for the float32 copy of x")
    if code:
        raise ValueError(f"q5_matmul failed with code {code}")
    return out
