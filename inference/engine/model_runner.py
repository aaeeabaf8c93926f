"""Turns a scheduled batch into model inputs, runs the model, returns logits.

Inputs are built with plain Python lists and converted with one
`torch.tensor` call each (no per-token tensor ops, no `.item()`). Logits are
computed only for the rows that sample this step: the last new token of each
sequence whose scheduled tokens reach the end of what it knows.
"""

from __future__ import annotations

import torch

from inference.engine.attention_metadata import AttentionMetadata
from inference.engine.cuda_graphs import DecodeGraphRunner
from inference.engine.kv_cache import allocate_kv_caches
from inference.engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model, model_config, *, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device, max_num_seqs: int = 256, max_model_len: int | None = None,
                 cuda_graphs: bool = False) -> None:
        self.model = model
        self.device = device
        self.block_size = block_size
        self.kv_caches = allocate_kv_caches(model_config, num_blocks, block_size, dtype, device)
        # Decode steps replay CUDA graphs on CUDA; everything else (and the CPU) runs eagerly.
        self.graph_runner: DecodeGraphRunner | None = None
        if device.type == "cuda" and cuda_graphs and max_model_len:
            self.graph_runner = DecodeGraphRunner(
                model, self.kv_caches, max_batch_size=max_num_seqs,
                max_blocks_per_seq=-(-max_model_len // block_size), device=device, capture=True)

    def prepare(self, seqs: list[Sequence], num_new_tokens: list[int]):
        """-> (input_ids, positions, meta, sample_rows, sampling_seqs)."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        sampling: list[Sequence] = []
        tables = []
        for seq, n in zip(seqs, num_new_tokens):
            start = seq.num_computed_tokens
            end = start + n
            table = seq.block_table
            if n == 1:
                input_ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                input_ids.extend(seq.token_ids[start:end])
                positions.extend(range(start, end))
                pos = start
                while pos < end:  # one range per block touched
                    upto = min(end, (pos // bs + 1) * bs)
                    base = table[pos // bs] * bs - (pos // bs) * bs
                    slots.extend(range(base + pos, base + upto))
                    pos = upto
            starts.append(starts[-1] + n)
            seq_lens.append(end)
            tables.append(table)
            if end == seq.num_tokens:
                sample_rows.append(starts[-1] - 1)
                sampling.append(seq)
        width = max(len(t) for t in tables)
        block_tables = [t + [0] * (width - len(t)) for t in tables]
        max_query_len = max(num_new_tokens)
        dev = self.device
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(block_tables, dtype=torch.int32, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            max_query_len=max_query_len,
            max_seq_len=max(seq_lens),
            decode_only=max_query_len == 1,
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos, meta, sample_rows, sampling

    @torch.inference_mode()
    def run(self, ids, pos, meta, sample_rows, sampling) -> tuple[list[Sequence], torch.Tensor | None]:
        """Run one step on inputs from prepare(); return the sequences that sample and their float32 logits [N, V] (on CPU)."""
        hidden = self.graph_runner.run(ids, pos, meta) if self.graph_runner is not None else None
        if hidden is None:  # not decode-only, too big or too wide for the graphs: eager
            hidden = self.model(ids, pos, meta, self.kv_caches)
        if not sampling:
            return sampling, None
        if len(sample_rows) != hidden.shape[0]:
            hidden = hidden[torch.tensor(sample_rows, device=self.device)]
        logits = self.model.compute_logits(hidden)
        return sampling, logits.cpu() if logits.device.type != "cpu" else logits
