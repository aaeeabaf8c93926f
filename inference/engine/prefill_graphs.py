"""Piecewise CUDA graphs for prompt and mixed steps, at a ladder of token counts.

An eager forward of a prefill step is some 360 launches (SmolLM2's 30 layers: norms,
four matmuls, the rotary + K/V store, activation, attention), and on the H100 its
host side took 28 ms for 6 ms of GPU work (BENCHMARKS.md). Everything in a layer but
attention works row by row, so it does not care how the step's tokens split into
sequences: only the token count fixes its shapes. So, as vLLM does, the forward is
cut at attention: piece 0 is the embedding and the first layer up to its rotated
queries; piece j (1 <= j < L) is layer j-1 after attention (o_proj, norm, MLP) and
layer j up to its rotated queries; piece L is the last layer after attention and the
final norm. Each piece is captured as a CUDA graph per ladder size (the step's token
count padded up: 16, 32, ... 8192), and attention runs eagerly between them with the
step's own metadata (any mix of prompt chunks and decodes, the mixed-step split
included): 2L + 1 launches from the host instead of ~12 L.

Static buffers connect the pieces to the eager attention: the token ids, positions
and slots (copied in from the step's inputs), the rotated queries (each piece's last
write: the Triton rotary kernel writes them there directly) and the attention output
(the next piece's first read: the prefill kernel writes it there directly), all sized
for the largest rung. The residual stream passes from one piece to the next inside the graphs'
shared memory pool (it is written by piece j and read by piece j+1 of the same size
only, with nothing but attention, outside the pool, in between). Padding rows (past
the live tokens, up to the rung) carry slot -1, so the K/V store never writes them;
their outputs are discarded. With ``capture=False`` the same pieces run eagerly on
the same buffers (the debugging switch, and what the CPU tests prove).

``run`` returns a view of the rung's static output, overwritten by the next ``run``.
"""

from __future__ import annotations

import logging

import torch

from kernels.dispatch import get_ops

from .attention_metadata import AttentionMetadata
from .cuda_graphs import ladder_sizes

log = logging.getLogger(__name__)

DEFAULT_PREFILL_LADDER = (16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8192)


class PrefillGraphRunner:
    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], *, max_tokens: int,
                 device: torch.device | str, ladder=DEFAULT_PREFILL_LADDER, capture: bool) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.device = torch.device(device)
        self.sizes = ladder_sizes(ladder, max_tokens)
        self.max_tokens = self.sizes[-1]
        self.ops = get_ops(self.device)
        if capture and (self.device.type != "cuda" or self.ops.backend != "triton"):
            log.warning("piecewise CUDA graphs need the Triton kernels on a CUDA device (device %s, backend %s); "
                        "prompt steps run the pieces eagerly", self.device, self.ops.backend)
            capture = False
        self.capture = capture
        cfg = model.config
        self.num_layers = len(model.layers)
        attn = model.layers[0].self_attn
        self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
        n, dev, dtype = self.max_tokens, self.device, model.embed_tokens.weight.dtype
        with torch.inference_mode():
            self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
            self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
            self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
            self.q = torch.zeros((n, self.num_heads, self.head_dim), dtype=dtype, device=dev)
            self.attn_out = torch.zeros((n, self.num_heads * self.head_dim), dtype=dtype, device=dev)
            self.cos_sin = model.layer_cos_sin(dev)  # each layer's (Gemma 3's local layers have their own)
        self.hidden_size = cfg.hidden_size
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # each rung's final hidden states (its last piece's output)
        self._pool = None
        self._live_rows = 0  # rows at or beyond this index hold slot -1

    def padded_size(self, num_tokens: int) -> int | None:
        for size in self.sizes:
            if size >= num_tokens:
                return size
        return None

    def accepts(self, num_tokens: int, meta: AttentionMetadata) -> bool:
        return 0 < num_tokens <= self.max_tokens and not meta.batch_invariant

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        """hidden [T, H] after the final norm, or None when the step does not fit (the caller runs it eagerly)."""
        tokens = int(input_ids.shape[0])
        if not self.accepts(tokens, meta):
            return None
        size = self.padded_size(tokens)
        self._load(input_ids, positions, meta.slot_mapping, tokens)
        if self.capture and size not in self.graphs:
            self._capture(size)
        graphs = self.graphs.get(size)
        carry = None
        for j in range(self.num_layers + 1):
            if graphs is not None:
                graphs[j].replay()
            else:
                carry = self._piece(j, size, carry)
            if j < self.num_layers:
                self._attend(j, tokens, meta)
        out = self.outputs[size] if graphs is not None else carry
        return out[:tokens]

    def capture_all(self) -> None:
        """Capture every rung now, largest first (the pool then fits the rest). Runs padding rows only
        (slot -1), so nothing is written to the KV cache; call it at start-up."""
        if not self.capture:
            return
        with torch.inference_mode():
            self._reset_slots(0, self._live_rows)
            self._live_rows = 0
            for size in reversed(self.sizes):
                if size not in self.graphs:
                    self._capture(size)

    # ---- internals --------------------------------------------------------------------------

    def _load(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, tokens: int) -> None:
        self.input_ids[:tokens].copy_(input_ids, non_blocking=True)
        self.positions[:tokens].copy_(positions, non_blocking=True)
        self.slot_mapping[:tokens].copy_(slots, non_blocking=True)
        if tokens < self._live_rows:  # rows a bigger step left live become padding again
            self._reset_slots(tokens, self._live_rows)
        self._live_rows = tokens

    def _reset_slots(self, start: int, stop: int) -> None:
        if start < stop:
            self.slot_mapping[start:stop].fill_(-1)

    def _piece(self, j: int, size: int, residual: torch.Tensor | None) -> torch.Tensor:
        """Piece j on the first ``size`` rows of the static buffers -> the residual stream (the final
        hidden states for the last piece). Writes the rotated queries of layer j into ``self.q``."""
        model, ops, layers = self.model, self.ops, self.model.layers
        if j == 0:
            hidden = model.embed(self.input_ids[:size])
        else:
            prev = layers[j - 1]
            hidden = prev.self_attn.o_proj.forward(self.attn_out[:size])
            hidden, residual = prev.after_attention(hidden, residual, ops)
        if j == self.num_layers:
            hidden, _ = ops.fused_add_rms_norm(hidden, residual, model.norm.weight, model.norm.eps)
            return hidden
        layer = layers[j]
        hidden, residual = layer.input_norm(hidden, residual, ops)
        q_buf = self.q[:size]
        into = {"q_out": q_buf} if ops.backend == "triton" else {}  # the Triton kernel writes it in place
        q = layer.self_attn.project(self.positions[:size], hidden, self.cos_sin[j], self.kv_caches[j],
                                    self.slot_mapping[:size], ops, **into)
        if q is not q_buf:
            q_buf.copy_(q)
        return residual

    def _attend(self, j: int, tokens: int, meta: AttentionMetadata) -> None:
        """Layer j's attention over the live rows, eagerly (PagedAttention's choice of kernels), into
        ``self.attn_out``."""
        ops, attn = self.ops, self.model.layers[j].self_attn.attn
        k_cache, v_cache = self.kv_caches[j]
        q = self.q[:tokens]
        out = self.attn_out[:tokens].view(tokens, self.num_heads, self.head_dim)
        if meta.decode_only:
            out.copy_(ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, attn.scale,
                                                 window=attn.window))
            return
        decodes = meta.num_decodes
        args = (q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, attn.scale,
                meta.max_query_len, meta.max_seq_len)
        if ops.backend == "triton":
            ops.paged_prefill_attention(*args, first_seq=decodes, out=out, window=attn.window)
        else:
            out.copy_(ops.paged_prefill_attention(*args, first_seq=decodes, window=attn.window))
        if decodes:
            out[:decodes] = ops.paged_decode_attention(q[:decodes], k_cache, v_cache, meta.block_tables[:decodes],
                                                       meta.seq_lens[:decodes], attn.scale, window=attn.window)

    def _capture(self, size: int) -> None:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # warm-up: compiles kernels, picks cuBLAS algorithms for these shapes
            carry = None
            for j in range(self.num_layers + 1):
                carry = self._piece(j, size, carry)
        current.wait_stream(side)
        graphs, carry = [], None
        for j in range(self.num_layers + 1):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._piece(j, size, carry)
            if self._pool is None:
                self._pool = graph.pool()
            graphs.append(graph)
            carry = out  # the previous piece's residual is no longer referenced: the pool may reuse it
        self.graphs[size] = graphs
        self.outputs[size] = carry
        log.debug("captured %d prefill pieces for %d tokens", len(graphs), size)
