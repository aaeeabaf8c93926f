"""Native CPU paged decode attention (``kernels/csrc/paged_decode_attention.c``).

Same contract as ``paged_decode_attention_ref``: q [B, Hq, D]; k_cache/v_cache
[num_blocks, block_size, Hkv, D]; block_tables [B, M] int32; seq_lens [B]
int32. Each sequence's K/V is read once, in place, from the paged cache: no
gather copy, no padding. All query heads of a KV head share each K/V row, the
softmax runs online in float32 with float32 accumulation, and at small batches
each sequence is split into parts (merged by log-sum-exp) so that every thread
has work. A sliding ``window`` starts each sequence's keys at seq_len - window, so a
windowed layer reads only its window (and the blocks before it are never touched).
When the library cannot be built or loaded (no compiler, ``cpu_native`` configured
off in ``kernels.config``) this falls back to the reference.
"""

from __future__ import annotations

import torch

from kernels import cpu_native
from kernels._utils import check_decode_inputs
from kernels.paged_decode_attention import paged_decode_attention_ref

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_ERRORS = {
    1: "seq_lens must lie in [0, block_tables.shape[1] * block_size]",
    2: "block_tables holds a block id outside [0, num_blocks) for a token in use",
    3: "invalid sizes",
    4: "out of memory for the split-KV scratch",
}


def paged_decode_attention_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    window: int = 0,
    split_tiles: int | None = None,
) -> torch.Tensor:
    """Decode attention on CPU tensors; ``num_splits`` forces the parts per sequence (tests); ``split_tiles``
    instead cuts every row into parts of that many 32-key tiles from its first key, so a row's result depends on
    its own length only (batch-invariant mode, kernels/row_attention.py)."""
    lib = cpu_native.load()
    if lib is None:
        return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
    batch, num_heads, head_dim, block_size, num_kv_heads = check_decode_inputs(q, k_cache, v_cache, block_tables,
                                                                               seq_lens)
    if not (q.is_cpu and k_cache.is_cpu and block_tables.is_cpu and seq_lens.is_cpu):
        for name, t in (("q", q), ("k_cache", k_cache), ("block_tables", block_tables), ("seq_lens", seq_lens)):
            if not t.is_cpu:
                raise ValueError(f"{name} is on {t.device}; the native kernel takes CPU tensors")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be positive, got {num_splits}")
    if split_tiles is not None and (split_tiles < 1 or num_splits is not None):
        raise ValueError(f"split_tiles must be positive and not given with num_splits, got {split_tiles}")
    num_blocks = k_cache.shape[0]
    code = _DTYPE_CODES[q.dtype]
    if q.stride(2) != 1 and q.numel():
        q = q.contiguous()
    if block_tables.stride(1) != 1 and block_tables.numel():
        block_tables = block_tables.contiguous()
    if not seq_lens.is_contiguous():
        seq_lens = seq_lens.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # [B, Hq, D]
    if batch == 0:
        return out
    status = lib.paged_decode_attention(
        q.data_ptr(), q.stride(0), q.stride(1),
        k_cache.data_ptr(), v_cache.data_ptr(),
        num_blocks, block_size, num_kv_heads,
        block_tables.data_ptr(), block_tables.stride(0), block_tables.shape[1],
        seq_lens.data_ptr(), out.data_ptr(),
        batch, num_heads, head_dim,
        float(scale), code, -split_tiles if split_tiles else num_splits or 0, torch.get_num_threads(), int(window),
    )
    if status:
        raise ValueError(f"paged_decode_attention_cpu: {_ERRORS.get(status, f'error {status}')}")
    return out
