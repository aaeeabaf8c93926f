"""Random paged-KV problems and a float64 dense attention to check against."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [B, M]
    query_start_loc: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]
    q_lens: list[int]
    scale: float

    @property
    def max_query_len(self) -> int:
        return max(self.q_lens)

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())

    def attention_metadata(self, num_decodes: int = 0):
        """The engine's metadata for this case as a prefill/mixed step whose K/V are already in the cache
        (every slot -1: the attention layer stores nothing); ``num_decodes`` leading decodes split off."""
        from inference.engine.attention_metadata import AttentionMetadata

        return AttentionMetadata(
            query_start_loc=self.query_start_loc, seq_lens=self.seq_lens, block_tables=self.block_tables,
            slot_mapping=torch.full((self.q.shape[0],), -1, dtype=torch.int64, device=self.q.device),
            max_query_len=self.max_query_len, max_seq_len=self.max_seq_len, decode_only=False,
            num_decodes=num_decodes,
        )


def make_paged_case(
    q_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
    extra_table_cols: int = 2,
) -> PagedCase:
    """Sequences scattered over a shuffled block pool; every slot holds random data
    (including slots no sequence owns, so a masking bug shows up)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(need) + extra_table_cols
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return PagedCase(
        q=q.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=tables.to(device),
        query_start_loc=starts.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        q_lens=list(q_lens),
        scale=head_dim**-0.5,
    )


def dense_kv(case: PagedCase, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence b's K and V as [seq_len, Hkv, D], read slot by slot."""
    block_size = case.k_cache.shape[1]
    n = int(case.seq_lens[b])
    pos = torch.arange(n)
    blocks = case.block_tables[b].cpu().long()[pos // block_size]
    offsets = pos % block_size
    k = case.k_cache.cpu()[blocks, offsets]
    v = case.v_cache.cpu()[blocks, offsets]
    return k, v


def naive_attention(case: PagedCase) -> torch.Tensor:
    """Per-sequence, per-head float64 causal attention with explicit loops over heads."""
    q = case.q.cpu().double()
    num_heads = q.shape[1]
    num_kv_heads = case.k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    start = 0
    for b, q_len in enumerate(case.q_lens):
        k, v = dense_kv(case, b)
        k, v = k.double(), v.double()
        n = k.shape[0]
        for i in range(q_len):
            pos = n - q_len + i
            for h in range(num_heads):
                kh = k[: pos + 1, h // group]
                vh = v[: pos + 1, h // group]
                scores = kh @ q[start + i, h] * case.scale
                weights = torch.softmax(scores, dim=0)
                out[start + i, h] = weights @ vh
        start += q_len
    return out
