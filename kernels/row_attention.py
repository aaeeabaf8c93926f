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

- ``cpu``: the native decode kernel with one split per row (its online softmax
  walks tiles of 32 keys from key 0).
- ``triton``: the prefill kernel, one row per program (query length 1): tiles
  of 64 keys from key 0 for every row.
- ``ref``: the reference decode attention, one row per call (slow; the
  fallback where neither kernel set runs).

A sliding ``window`` (> 0) limits row p to keys p - window + 1 .. p, in every
path (the native CPU kernel starts its one split at the window's first key).
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


def paged_attention_rows_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             row_block_tables: torch.Tensor, row_seq_lens: torch.Tensor, scale: float,
                             window: int = 0) -> torch.Tensor:
    from kernels import cpu_native
    from kernels.paged_decode_attention_cpu import paged_decode_attention_cpu

    if cpu_native.load() is None:
        return paged_attention_rows_ref(q, k_cache, v_cache, row_block_tables, row_seq_lens, scale, window)
    # one split per row: a row's keys are summed in one order whatever else is in the batch
    return paged_decode_attention_cpu(q, k_cache, v_cache, row_block_tables, row_seq_lens, scale, num_splits=1,
                                      window=window)


def paged_attention_rows_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                row_block_tables: torch.Tensor, row_seq_lens: torch.Tensor,
                                scale: float, window: int = 0) -> torch.Tensor:
    from kernels.prefill_attention import paged_prefill_attention

    rows = q.shape[0]
    starts = torch.arange(rows + 1, dtype=torch.int32, device=q.device)
    # max_seq_len only sizes nothing in the kernel; 1 new token per row
    return paged_prefill_attention(q, k_cache, v_cache, row_block_tables, starts, row_seq_lens, scale,
                                   1 if rows else 0, 0, window=window)
