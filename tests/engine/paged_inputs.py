"""Hand-built paged-KV bookkeeping for model tests (no block manager, no scheduler).

Blocks are handed out in a shuffled order, so a sequence's blocks are never
contiguous and block tables really matter. `step` builds AttentionMetadata
exactly as the contract describes and runs one forward pass.
"""

from __future__ import annotations

import random

import torch

from inference.engine.attention_metadata import AttentionMetadata
from inference.engine.kv_cache import allocate_kv_caches


class PagedSequences:
    def __init__(self, model, *, dtype: torch.dtype, num_blocks: int = 128, block_size: int = 16, seed: int = 0):
        self.model, self.block_size = model, block_size
        self.caches = allocate_kv_caches(model.config, num_blocks, block_size, dtype, "cpu")
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    def step(self, chunks: list[tuple[str, list[int]]], all_rows: bool = False) -> torch.Tensor:
        """Feed each sequence its next tokens; logits [len(chunks), V] for each chunk's last token
        (or for every token with all_rows)."""
        ids, positions, slots, starts, seq_lens = [], [], [], [0], []
        for seq_id, tokens in chunks:
            table = self.tables.setdefault(seq_id, [])
            start = self.lens.get(seq_id, 0)
            end = start + len(tokens)
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            for pos in range(start, end):
                slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            ids.extend(tokens)
            positions.extend(range(start, end))
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(end)
            self.lens[seq_id] = end
        width = max(len(self.tables[s]) for s, _ in chunks)
        tables = torch.zeros(len(chunks), width, dtype=torch.int32)
        for row, (seq_id, _) in enumerate(chunks):
            tables[row, :len(self.tables[seq_id])] = torch.tensor(self.tables[seq_id], dtype=torch.int32)
        q_lens = [len(t) for _, t in chunks]
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            decode_only=all(n == 1 for n in q_lens),
        )
        with torch.inference_mode():
            hidden = self.model(torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64),
                                meta, self.caches)
            rows = hidden if all_rows else hidden[torch.tensor(starts[1:]) - 1]
            return self.model.compute_logits(rows)


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """transformers' logits for every position of one sequence, float32 [T, V]."""
    with torch.inference_mode():
        return hf_model(torch.tensor([token_ids])).logits[0].float()
