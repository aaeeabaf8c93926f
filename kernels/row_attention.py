"""Attention one query row at a time: the batch-invariant mode's attention.

Each row of q [T, Hq, D] is a token at some position p of some sequence; it
attends to that sequence's cached keys 0..p. Given ``row_block_tables`` [T, M]
(each row's sequence's block table) and ``row_seq_lens`` [T] (p + 1), every
row is computed as a one-token sequence of its own, so its reduction order
depends on nothing but its own keys: not on how many rows the step has, which
sequences share it, whether its sequence's prompt came whole, in chunks or
partly from the prefix cache, or whether the row is a decode. (A mixed step
otherwise sends its decodes to the split-KV decode kernel and its prompt rows
to the prefill kernel, and the decode kernel picks its splits from the
batch; see inference/engine/attention.py.)

- ``cpu``: the native decode kernel, each row cut into parts of ROW_SPLIT_TILES
  tiles of 32 keys from its first key (its online softmax walks the tiles in
  order; the parts merge in order, empty ones skipped), so a row's parts depend
  on its own length only and a long row still spreads over the threads.
- ``triton``: the prefill kernel, one row per program (query length 1): tiles
  of 64 keys from key 0 for every row.
- ``ref``: the reference decode attention, one row per call (slow; the
  fallback where neither kernel set runs).

A sliding ``window`` (> 0) limits row p to keys p - window + 1 .. p, in every
path (the native CPU kernel starts its first part at the window's first key).
"""

from __future__ import annotations

import torch

from kernels.paged_decode_attention import paged_decode_attention_ref


def paged_attention_rows_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             row_block_tables: torch.Tensor, row_seq_lens: torch.Tensor, scale: float,
                             window: int = 0) -> torch.Tensor:
    out = torch.empty_like(q)
    for row in range(q.shape[0]):
        out[row:row + 1] = paged_decode_attention_ref(q[row:row + 1], k_cache, v_cache, row_block_tables[row:row + 1],
                                                      row_seq_lens[row:row + 1], scale, window)
    return out


# Batch-invariant rows on the CPU attend in parts of this many 32-key tiles (128 keys: the decode kernel's
# shortest split), each part an item a thread can take; the native decoder stack passes the same.
ROW_SPLIT_TILES = 4


def paged_attention_rows_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             row_block_tables: torch.Tensor, row_seq_lens: torch.Tensor, scale: float,
                             window: int = 0) -> torch.Tensor:
    from kernels import cpu_native
    from kernels.paged_decode_attention_cpu import paged_decode_attention_cpu

    if cpu_native.load() is None:
        return paged_attention_rows_ref(q, k_cache, v_cache, row_block_tables, row_seq_lens, scale, window)
    # parts of a fixed size from each row's first key: a row's keys are summed in one order whatever else is in
    # the batch, and a long row still spreads over the threads
    return paged_decode_attention_cpu(q, k_cache, v_cache, row_block_tables, row_seq_lens, scale,
                                      window=window, split_tiles=ROW_SPLIT_TILES)


def paged_attention_rows_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                row_block_tables: torch.Tensor, row_seq_lens: torch.Tensor,
                                scale: float, window: int = 0) -> torch.Tensor:
    from kernels.prefill_attention import paged_prefill_attention

    rows = q.shape[0]
    starts = torch.arange(rows + 1, dtype=torch.int32, device=q.device)
    # max_seq_len only sizes nothing in the kernel; 1 new token per row
    return paged_prefill_attention(q, k_cache, v_cache, row_block_tables, starts, row_seq_lens, scale,
                                   1 if rows else 0, 0, window=window)
