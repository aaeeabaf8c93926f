"""Hand-built paged-KV bookkeeping for model tests (no block manager, no scheduler).

Blocks are handed out in a shuffled order, so a sequence's blocks are never
contiguous and block tables really matter. `step` builds AttentionMetadata
exactly as the contract describes and runs one forward pass; `Batches` does the
same bookkeeping on any device with random tokens, and `first_layers` cuts a
model down to its first layers, for tests that compare two ways of running it.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import torch
from torch import nn

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
        for seq_id, _ in chunks:
            self.tables.setdefault(seq_id, [])
            self.lens.setdefault(seq_id, 0)
        ids, positions, meta, _ = step_inputs(self.tables, self.lens, self.free, self.block_size, chunks)
        with torch.inference_mode():
            hidden = self.model(ids, positions, meta, self.caches)
            rows = hidden if all_rows else hidden[meta.query_start_loc[1:].long() - 1]
            return self.model.compute_logits(rows)


def step_inputs(tables, lens, free: list[int], block_size: int, chunks, device="cpu"):
    """Inputs of one step, built as the contract describes (and as ModelRunner.prepare does).

    `tables[key]` / `lens[key]` hold each sequence's block table and cached length (updated here);
    new blocks come from the end of `free`; chunks are (key, new token ids).
    -> (input_ids, positions, AttentionMetadata, live slots).
    """
    ids, positions, slots, starts, seq_lens = [], [], [], [0], []
    for key, tokens in chunks:
        table, start = tables[key], lens[key]
        end = start + len(tokens)
        while len(table) * block_size < end:
            table.append(free.pop())
        for pos in range(start, end):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        ids.extend(tokens)
        positions.extend(range(start, end))
        starts.append(starts[-1] + len(tokens))
        seq_lens.append(end)
        lens[key] = end
    width = max(len(tables[key]) for key, _ in chunks)
    padded = [tables[key] + [0] * (width - len(tables[key])) for key, _ in chunks]
    q_max = max(len(tokens) for _, tokens in chunks)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=q_max,
        max_seq_len=max(seq_lens),
        decode_only=q_max == 1,
    )
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=device)  # noqa: E731
    return as_tensor(ids), as_tensor(positions), meta, slots


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """transformers' logits for every position of one sequence, float32 [T, V]."""
    with torch.inference_mode():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


BLOCK_SIZE = 16  # Batches' blocks


class Batches:
    """Hand-built paged sequences on one device: block tables from a shuffled free list, and
    AttentionMetadata built the way ModelRunner.prepare builds it (table width = the batch's widest)."""

    def __init__(self, config, *, num_blocks: int, dtype: torch.dtype, device: str, seed: int = 0) -> None:
        self.device = torch.device(device)
        self.caches = allocate_kv_caches(config, num_blocks, BLOCK_SIZE, dtype, self.device)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.free.remove(0)
        self.free.append(0)  # block 0 (what padding rows read) goes to the first sequence: a stray write would show
        self.tables: list[list[int]] = []
        self.lens: list[int] = []
        self.vocab = config.vocab_size
        self.rng = random.Random(seed + 1)

    def new_sequences(self, count: int) -> list[int]:
        self.tables.extend([] for _ in range(count))
        self.lens.extend(0 for _ in range(count))
        return list(range(len(self.lens) - count, len(self.lens)))

    def build(self, chunks: list[tuple[int, int]]):
        """chunks: (sequence index, new token count) -> (ids, positions, meta, live slots)."""
        with_tokens = [(seq, [self.rng.randrange(1, self.vocab) for _ in range(n)]) for seq, n in chunks]
        return step_inputs(self.tables, self.lens, self.free, BLOCK_SIZE, with_tokens, self.device)


def first_layers(loaded, count: int):
    """A view of the model with only its first `count` layers (weights shared, the original untouched)."""
    small = copy.copy(loaded.model)
    small._modules = dict(loaded.model._modules)
    small._modules["layers"] = nn.ModuleList(list(loaded.model.layers[:count]))
    small._cos_sin = {}
    return small, dataclasses.replace(loaded.config, num_layers=count)
