"""Vectorised dequantisation of GGML tensor data into torch tensors.

Each quantised type stores fixed-size blocks; we view the raw bytes as
[n_blocks, type_size] uint8 and unpack every block at once with tensor ops
(no Python loop over blocks or rows). Arithmetic is float32, as in ggml, and
the result is cast once to the requested dtype.

Layouts (ggml-common.h), per block:
  Q8_0  (32 values, 34 bytes):  d:f16, q:int8[32]                 x = d*q
  Q4_0  (32 values, 18 bytes):  d:f16, qs:u8[16]                  x = d*(nibble-8)
  Q4_1  (32 values, 20 bytes):  d:f16, m:f16, qs:u8[16]           x = d*nibble + m
        values 0..15 are the low nibbles of qs, 16..31 the high nibbles.
  Q5_0  (32 values, 22 bytes):  d:f16, qh:u8[4], qs:u8[16]        x = d*(q5-16)
  Q5_1  (32 values, 24 bytes):  d:f16, m:f16, qh:u8[4], qs:u8[16] x = d*q5 + m
        q5 = the Q4 nibble of value j | bit j of qh (little-endian 32 bits) << 4.
  Q4_K  (256 values, 144 bytes): d:f16, dmin:f16, scales:u8[12] (8 six-bit
        scales and 8 six-bit mins), qs:u8[128]; sub-block j of 32 values is
        d*sc[j]*nibble - dmin*m[j], chunk c of 32 bytes giving sub-blocks 2c
        (low nibbles) and 2c+1 (high nibbles).
  Q5_K  (256 values, 176 bytes): Q4_K's d, dmin, scales, then qh:u8[32],
        qs:u8[128]; value l of sub-block j has Q4_K's nibble | bit j of qh[l] << 4.
  Q6_K  (256 values, 210 bytes): ql:u8[128], qh:u8[64], scales:i8[16], d:f16;
        two halves of 128 values, each from 64 ql bytes and 32 qh bytes;
        value = d*scale[i//16]*(q6-32).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .packed_linear import Int4Groups, Int8Blocks, Q5Blocks

QK_K = 256

SUPPORTED_TYPES = (
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte `start` of every block, as float32 [n, 1]."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 2k]: the low nibbles, then the high nibbles."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks, 0)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    return (_nibbles(blocks[:, 2:]).float() - 8.0) * _f16(blocks, 0)


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    return _nibbles(blocks[:, 4:]).float() * _f16(blocks, 0) + _f16(blocks, 2)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """[n, k] bytes -> [n, 8k] uint8 bits, bit j of the little-endian k-byte word at position j."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(qh.shape[0], -1)


def _q5(blocks: torch.Tensor, qh_at: int) -> torch.Tensor:
    """The 32 five-bit codes of Q5_0/Q5_1 blocks whose qh starts at byte `qh_at`, as float32 [n, 32]."""
    return (_nibbles(blocks[:, qh_at + 4:]) | (_bits(blocks[:, qh_at:qh_at + 4]) << 4)).float()


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    return (_q5(blocks, 2) - 16.0) * _f16(blocks, 0)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    return _q5(blocks, 4) * _f16(blocks, 0) + _f16(blocks, 2)


def _k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte Q4_K/Q5_K header into eight 6-bit scales and eight 6-bit mins."""
    low_sc, low_mn, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat((low_sc & 0x3F, (high & 0x0F) | ((low_sc >> 2) & 0x30)), dim=-1)
    mins = torch.cat((low_mn & 0x3F, (high >> 4) | ((low_mn >> 2) & 0x30)), dim=-1)
    return scales.float(), mins.float()


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(n, 4, 1, 32)
    q = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, 8, 32).float()
    return (q * (d * scales).unsqueeze(-1) - (dmin * mins).unsqueeze(-1)).reshape(n, QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    qh = blocks[:, 16:48].reshape(n, 1, 32)
    high = torch.cat([(qh >> j) & 1 for j in range(8)], dim=1)  # [n, 8, 32]: bit j of qh[l] for sub-block j
    qs = blocks[:, 48:].reshape(n, 4, 1, 32)
    low = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, 8, 32)
    q = (low | (high << 4)).float()
    return (q * (d * scales).unsqueeze(-1) - (dmin * mins).unsqueeze(-1)).reshape(n, QK_K)


def _q6_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks [n, 210] -> (codes q6-32 as int8 [n, 16, 16], the sub-blocks' float32 scales d*sc [n, 16])."""
    n = blocks.shape[0]
    ql = blocks[:, :128].reshape(n, 2, 1, 64)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]
    d = _f16(blocks, 208)
    low = torch.cat((ql & 0x0F, ql >> 4), dim=2).reshape(n, 2, 4, 32)
    high = torch.cat([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=2)  # [n, 2, 4, 32]
    codes = ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8).reshape(n, 16, 16)
    return codes, d * scales


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    codes, scales = _q6_k_parts(blocks)
    return (codes.float() * scales.unsqueeze(-1)).reshape(blocks.shape[0], QK_K)


def _q6_k_blocks(raw: np.ndarray | torch.Tensor, shape: tuple[int, int]) -> Int8Blocks:
    rows, cols = shape
    blocks = _as_byte_tensor(raw).reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType.Q6_K][1])
    codes, scales = _q6_k_parts(blocks)
    return Int8Blocks(codes.reshape(rows, cols), scales.reshape(rows, cols // 16).contiguous())


_BLOCK_DEQUANTIZERS = {
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q5_0: _q5_0,
    GGMLQuantizationType.Q5_1: _q5_1,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}


def dequantize(raw: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType | int, shape: tuple[int, ...],
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantise the raw bytes of one GGML tensor to a torch tensor of `shape` (row-major, torch order)."""
    qtype = GGMLQuantizationType(qtype)
    if qtype not in SUPPORTED_TYPES:
        raise NotImplementedError(f"GGML type {qtype.name} is not supported (supported: "
                                  f"{', '.join(t.name for t in SUPPORTED_TYPES)})")
    data = _as_byte_tensor(raw)
    numel = int(np.prod(shape)) if shape else 1
    if qtype == GGMLQuantizationType.F32:
        values = data.view(torch.float32)
    elif qtype == GGMLQuantizationType.F16:
        values = data.view(torch.float16)
    elif qtype == GGMLQuantizationType.BF16:
        values = data.view(torch.bfloat16)
    else:
        block_values, type_size = GGML_QUANT_SIZES[qtype]
        if data.numel() % type_size or (data.numel() // type_size) * block_values != numel:
            raise ValueError(f"{qtype.name}: {data.numel()} bytes do not hold {numel} values")
        values = _BLOCK_DEQUANTIZERS[qtype](data.reshape(-1, type_size))
    if values.numel() != numel:
        raise ValueError(f"{qtype.name}: got {values.numel()} values, expected {numel} for shape {shape}")
    return values.reshape(shape).to(dtype)


def int4_groups(raw: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType | int,
                shape: tuple[int, int]) -> Int4Groups | None:
    """The 4-bit codes, scales and zeros of a Q4_0/Q4_1/Q4_K matrix (None for any other type).

    Q4_0: x = d*(q-8)           -> scale d, zero 0
    Q4_1: x = d*q + m           -> scale d, zero m + 8d   (so that x = (q-8)*scale + zero)
    Q4_K: x = d*sc*q - dmin*m   -> per sub-block of 32: scale d*sc, zero 8*scale - dmin*m
    """
    qtype = GGMLQuantizationType(qtype)
    if len(shape) != 2:
        return None
    if qtype == GGMLQuantizationType.Q4_K:
        return _q4_k_groups(raw, shape)
    if qtype not in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
        return None
    rows, cols = shape
    block_values, type_size = GGML_QUANT_SIZES[qtype]
    blocks = _as_byte_tensor(raw).reshape(-1, type_size)
    groups = cols // block_values
    d = _f16(blocks, 0).view(rows, groups)
    if qtype == GGMLQuantizationType.Q4_0:
        codes, zeros = _nibbles(blocks[:, 2:]), torch.zeros_like(d)
    else:
        codes, zeros = _nibbles(blocks[:, 4:]), _f16(blocks, 2).view(rows, groups) + 8.0 * d
    return Int4Groups(codes.reshape(rows, cols), d, zeros)


def _q4_k_groups(raw: np.ndarray | torch.Tensor, shape: tuple[int, int]) -> Int4Groups:
    rows, cols = shape
    blocks = _as_byte_tensor(raw).reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K][1])
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mins = _k_scales_mins(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(n, 4, 1, 32)
    codes = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(rows, cols)  # sub-block order, as _q4_k
    scales = (d * sc).reshape(rows, cols // 32)
    return Int4Groups(codes, scales, 8.0 * scales - (dmin * mins).reshape(rows, cols // 32))


def _as_byte_tensor(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(raw, torch.Tensor):
        return raw.contiguous().reshape(-1).view(torch.uint8)
    array = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    # GGUF data is a read-only memory map; torch wants a writable buffer, so copy once here.
    return torch.from_numpy(array.copy())


def int8_blocks(raw: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType | int,
                shape: tuple[int, int]) -> Int8Blocks | None:
    """The int8 codes and scales of a Q8_0, Q5_0, Q4_0 or Q6_K matrix (None for any other type), all exactly
    x = d*code: Q8_0's code is q, Q5_0's q5-16 (-16..15), Q4_0's nibble-8 (-8..7), in blocks of 32; Q6_K's
    q6-32 (-32..31) in its sub-blocks of 16, whose scale is d*sc (float32, as `_q6_k` computes it)."""
    qtype = GGMLQuantizationType(qtype)
    if len(shape) != 2:
        return None
    if qtype == GGMLQuantizationType.Q6_K:
        return _q6_k_blocks(raw, shape)
    if qtype not in _INT8_CODES:
        return None
    rows, cols = shape
    block_values, type_size = GGML_QUANT_SIZES[qtype]
    blocks = _as_byte_tensor(raw).reshape(-1, type_size)
    codes = _INT8_CODES[qtype](blocks).reshape(rows, cols)
    return Int8Blocks(codes, _f16(blocks, 0).view(rows, cols // block_values).contiguous())


def q5_bytes(raw: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType | int,
             shape: tuple[int, int]) -> Q5Blocks | None:
    """A Q5_0 matrix's own bytes, one row of blocks per output row (None for any other type)."""
    if GGMLQuantizationType(qtype) != GGMLQuantizationType.Q5_0 or len(shape) != 2:
        return None
    rows, cols = shape
    return Q5Blocks(_as_byte_tensor(raw).reshape(rows, cols // 32 * GGML_QUANT_SIZES[GGMLQuantizationType.Q5_0][1]))


_INT8_CODES = {
    GGMLQuantizationType.Q8_0: lambda blocks: blocks[:, 2:].contiguous().view(torch.int8),
    GGMLQuantizationType.Q5_0: lambda blocks: (_q5(blocks, 2) - 16.0).to(torch.int8),
    GGMLQuantizationType.Q4_0: lambda blocks: (_nibbles(blocks[:, 2:]).to(torch.int8) - 8),
}
