"""CUDA graphs for decode steps, at a ladder of batch sizes.

A decode step of a small model is a few hundred tiny kernel launches, and the
launches, not the GPU, set its time. A CUDA graph replays all of them with one
launch, but it replays fixed addresses and fixed shapes. So the runner owns
static input buffers sized for the largest batch (token ids, positions, slot
mapping, sequence lengths, block tables, query start offsets), copies each live
batch into their first rows, pads the batch up to the next size on a ladder
(1, 2, 4, 8, 16, 24, 32, ... 256) and replays the graph captured for that size.

Padding rows are inert: token 0 at position 0, slot -1 (the KV store skips
negative slots, so they never write the cache), sequence length 1 over a block
table row of zeros (they read block 0, which is harmless), and their outputs
are discarded. Block tables are always the full `max_blocks_per_seq` wide, so
every shape a kernel sees, including the split count of the Triton decode
kernel (derived from the table width), is fixed per ladder size; the kernels
themselves make no host syncs, which is what capture requires.

Graphs are captured lazily, the first time a ladder size is used (or all at
once with `capture_all`), each after a warm-up run on a side stream that
compiles the Triton kernels, and all graphs share one memory pool. With
`capture=False` the same padded static-buffer forward runs eagerly: that is the
debugging switch on the GPU and the path the CPU tests prove.

`run` returns a view of the runner's static output buffer: it is overwritten by
the next `run`, so the caller must consume it (compute logits) before then.
"""

from __future__ import annotations

import logging

import torch

from kernels.dispatch import get_ops

from .attention_metadata import AttentionMetadata

log = logging.getLogger(__name__)

DEFAULT_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def ladder_sizes(ladder, max_batch_size: int) -> tuple[int, ...]:
    """The ladder cut at ``max_batch_size``, which becomes the top rung when it
    lies between two rungs; never above the ladder's own top."""
    rungs = sorted({int(s) for s in ladder if int(s) > 0})
    if not rungs or max_batch_size < 1:
        raise ValueError("need a non-empty ladder of positive sizes and max_batch_size >= 1")
    top = min(max_batch_size, rungs[-1])
    return tuple(s for s in rungs if s < top) + (top,)


class DecodeGraphRunner:
    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], *, max_batch_size: int,
                 max_blocks_per_seq: int, device: torch.device | str, ladder=DEFAULT_LADDER,
                 capture: bool) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.device = torch.device(device)
        self.sizes = ladder_sizes(ladder, max_batch_size)
        self.max_batch_size = self.sizes[-1]
        if max_blocks_per_seq < 1:
            raise ValueError("max_blocks_per_seq must be at least 1")
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_size = kv_caches[0][0].shape[1]
        backend = get_ops(self.device).backend
        if capture and (self.device.type != "cuda" or backend != "triton"):
            # The PyTorch references sync with the host (data-dependent shapes), so they cannot be captured.
            log.warning("CUDA graphs need the Triton kernels on a CUDA device (device %s, backend %s); "
                        "decode steps run the padded forward eagerly", self.device, backend)
            capture = False
        self.capture = capture
        n, dev = self.max_batch_size, self.device
        weight = model.embed_tokens.weight
        with torch.inference_mode():
            self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
            self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
            self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
            self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
            self.block_tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.int32, device=dev)
            # one new token per sequence: sequence b owns token b
            self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
            self.hidden = torch.empty((n, model.config.hidden_size), dtype=weight.dtype, device=dev)
        self.metas = {size: self._static_meta(size) for size in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._live_rows = 0  # rows at or beyond this index hold padding values

    def _static_meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.slot_mapping[:size],
            max_query_len=1,
            max_seq_len=self.max_blocks_per_seq * self.block_size,  # an upper bound, fixed for the graph
            decode_only=True,
        )

    def padded_size(self, batch: int) -> int | None:
        """The smallest ladder size >= ``batch``; None when the batch is too big."""
        for size in self.sizes:
            if size >= batch:
                return size
        return None

    def accepts(self, num_tokens: int, meta: AttentionMetadata) -> bool:
        """Whether ``run`` would handle this batch (a decode-only batch that fits the buffers)."""
        batch = meta.num_seqs
        return (meta.decode_only and batch > 0 and num_tokens == batch
                and batch <= self.max_batch_size
                and meta.block_tables.dim() == 2 and meta.block_tables.shape[1] <= self.max_blocks_per_seq)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """hidden [B, H] for a decode-only batch, or None (the caller runs the model eagerly).

        The result is a view of a static buffer that the next call overwrites.
        """
        if not self.accepts(int(input_ids.shape[0]), meta):
            return None
        batch = meta.num_seqs
        size = self.padded_size(batch)
        self._load(input_ids, positions, meta)
        if not self.capture:
            self._forward(size)
        else:
            graph = self.graphs.get(size)
            if graph is None:
                self._capture(size)  # its warm-up run already computed this batch; the replay redoes it
                graph = self.graphs[size]
            graph.replay()
        return self.hidden[:batch]

    def capture_all(self) -> None:
        """Capture every ladder size now, largest first (the pool then fits the rest).

        Runs only padding rows, so nothing is written to the KV cache; call it at start-up.
        """
        if not self.capture:
            return
        with torch.inference_mode():
            self._reset_rows(0, self._live_rows)
            self._live_rows = 0
            for size in reversed(self.sizes):
                if size not in self.graphs:
                    self._capture(size)

    # ---- internals --------------------------------------------------------------------------

    def _load(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        """Copy the live batch into rows [0, B) and make sure rows past it are padding."""
        batch, width = meta.num_seqs, meta.block_tables.shape[1]
        self.input_ids[:batch].copy_(input_ids, non_blocking=True)
        self.positions[:batch].copy_(positions, non_blocking=True)
        self.slot_mapping[:batch].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:batch].copy_(meta.seq_lens, non_blocking=True)
        self.block_tables[:batch, :width].copy_(meta.block_tables, non_blocking=True)
        if width < self.max_blocks_per_seq:
            self.block_tables[:batch, width:].zero_()
        if batch < self._live_rows:  # the previous batch was bigger: its extra rows become padding again
            self._reset_rows(batch, self._live_rows)
        self._live_rows = batch

    def _reset_rows(self, start: int, stop: int) -> None:
        if start >= stop:
            return
        self.input_ids[start:stop].zero_()
        self.positions[start:stop].zero_()
        self.slot_mapping[start:stop].fill_(-1)
        self.seq_lens[start:stop].fill_(1)
        self.block_tables[start:stop].zero_()

    def _forward(self, size: int) -> None:
        hidden = self.model(self.input_ids[:size], self.positions[:size], self.metas[size], self.kv_caches)
        self.hidden[:size].copy_(hidden)

    def _capture(self, size: int) -> None:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._forward(size)  # warm-up: compiles kernels, builds the rotary cache, sets up cuBLAS
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._forward(size)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[size] = graph
        log.debug("captured a decode CUDA graph for batch size %d", size)
