"""Turns a scheduled batch into model inputs, runs the model, returns logits.

Inputs are built with plain Python lists, packed into two flat C arrays (one
int64: token ids, positions, slots; one int32: query starts, lengths, block
tables) and moved to the device in two copies, the per-step tensors being
views of them (no per-token tensor ops, no `.item()`). Logits are computed only
for the rows that sample this step: the last new token of each sequence whose
scheduled tokens reach the end of what it knows.
"""

from __future__ import annotations

from array import array

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
            # every ladder size now, as vLLM does: no capture stalls a request in flight later
            self.graph_runner.capture_all()

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
        tables: list[array] = []
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
            tables.append(_table_array(seq))
            if seq.samples_after(n):
                sample_rows.append(starts[-1] - 1)
                sampling.append(seq)
        num_seqs, num_tokens = len(seqs), len(input_ids)
        width = max(len(t) for t in tables)
        longs = array("q", input_ids)
        longs.extend(positions)
        longs.extend(slots)
        ints = array("i", starts)
        ints.extend(seq_lens)
        table_at = len(ints)
        zeros = bytes(4 * width)
        for table in tables:  # each row zero-padded to the widest
            ints.extend(table)
            ints.frombytes(zeros[4 * len(table):])
        longs_t = torch.frombuffer(longs, dtype=torch.int64).to(self.device)
        ints_t = torch.frombuffer(ints, dtype=torch.int32).to(self.device)
        max_query_len = max(num_new_tokens)
        meta = AttentionMetadata(
            query_start_loc=ints_t[:num_seqs + 1],
            seq_lens=ints_t[num_seqs + 1:table_at],
            block_tables=ints_t[table_at:].view(num_seqs, width),
            slot_mapping=longs_t[2 * num_tokens:],
            max_query_len=max_query_len,
            max_seq_len=max(seq_lens),
            decode_only=max_query_len == 1,
        )
        return longs_t[:num_tokens], longs_t[num_tokens:2 * num_tokens], meta, sample_rows, sampling

    @torch.inference_mode()
    def run(self, ids, pos, meta, sample_rows, sampling) -> tuple[list[Sequence], torch.Tensor | None]:
        """Run one step on inputs from prepare(); return the sequences that sample and their float32 logits [N, V]
        on the model's device (the sampler runs there)."""
        hidden = self.graph_runner.run(ids, pos, meta) if self.graph_runner is not None else None
        if hidden is None:  # not decode-only, too big or too wide for the graphs: eager
            hidden = self.model(ids, pos, meta, self.kv_caches)
        if not sampling:
            return sampling, None
        if len(sample_rows) != hidden.shape[0]:
            hidden = hidden[torch.tensor(sample_rows, device=self.device)]
        logits = self.model.compute_logits(hidden)
        return sampling, logits


def _table_array(seq: Sequence) -> array:
    """``seq.block_table`` as an int32 array, kept in step across steps: the block manager only appends
    to a table or replaces it with a new list (free), so extending the copy by the new tail suffices."""
    table, copy = seq.block_table, seq.table_array
    if copy is None or seq.table_array_of is not table or len(copy) > len(table):
        copy = seq.table_array = array("i", table)
        seq.table_array_of = table
    elif len(copy) < len(table):
        copy.extend(table[len(copy):])
    return copy
