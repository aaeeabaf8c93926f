"""The decoder stack in one native call for CPU decode steps of a few rows (kernels/decode_stack_cpu.py).

At batch 1 a decode step's ~300 small ops each cost more around the kernel
than in it (docs/benchmarks/speculative.md): the per-op path spent ~9 ms of a
29 ms SmolLM2 step outside the kernels. `NativeStack` hands the whole stack
(every layer, then the final norm) to one C++ call that runs the same kernels
in the same order, so the hidden states are the per-op path's bit for bit
(tests/engine/test_native_stack.py) and nothing else changes: the LM head,
sampling and everything around the step stay as they are.

It applies where the per-op path would run exactly those kernels:
- the model: a Llama-family decoder without Gemma's extras, per-head q/k norms
  or projection biases, in bfloat16 on the CPU, every projection with its
  packed int4 copy (a Q4_0/Q4_1 GGUF), the `cpu` kernel set, and one rotary
  cache for all layers;
- the step: decode rows only (`meta.decode_only`: plain decodes and
  speculative draft rows, each its own query), at most as many as the int4
  copies take (`Linear.int4_max_rows`), bfloat16 caches; or, in
  batch-invariant mode, any step: that mode multiplies by the int4 copies at
  every row count and attends one row at a time, in parts of a fixed size, over
  `meta.row_block_tables` / `row_seq_lens` (inference/engine/invariant_mode.py),
  which is what the stack does given those rows and parts of ROW_SPLIT_TILES tiles.
Anything else takes the per-op path.
"""

from __future__ import annotations

import weakref

import torch

from kernels import decode_stack_cpu
from kernels.dispatch import get_ops
from kernels.row_attention import ROW_SPLIT_TILES

from .attention_metadata import AttentionMetadata


def _projections(layer) -> tuple:
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def eligible(model) -> bool:
    """Whether ``model`` (a LlamaForCausalLM) is one the native stack computes exactly."""
    config = model.config
    if config.gemma or config.qk_norm or config.attention_bias or any(model.local_rope):
        return False
    weight = model.embed_tokens.weight
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or get_ops(weight.device).backend != "cpu":
        return False
    norms = [model.norm]
    for layer in model.layers:
        for linear in _projections(layer):
            if linear.int4_weight is None or linear.bias is not None:
                return False
        norms += (layer.input_layernorm, layer.post_attention_layernorm)
    if any(norm.weight.dtype != torch.bfloat16 or norm.eps != config.rms_norm_eps for norm in norms):
        return False
    return decode_stack_cpu.load()


class NativeStack:
    def __init__(self, model) -> None:
        config = model.config
        weights: list[torch.Tensor] = []
        for layer in model.layers:
            qkv, o, gate_up, down = _projections(layer)
            weights += (layer.input_layernorm.weight.detach().contiguous(), qkv.int4_weight, qkv.int4_scales_zeros,
                        o.int4_weight, o.int4_scales_zeros, layer.post_attention_layernorm.weight.detach().contiguous(),
                        gate_up.int4_weight, gate_up.int4_scales_zeros, down.int4_weight, down.int4_scales_zeros)
        shape = [config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size]
        self.handle = decode_stack_cpu.register(weights, model.norm.weight.detach().contiguous(),
                                                [config.layer_window(i) for i in range(config.num_layers)], shape,
                                                config.rms_norm_eps, config.attention_scale)
        # the weights stay registered as long as the model lives
        weakref.finalize(model, decode_stack_cpu.unregister, self.handle)
        self.first_proj = model.layers[0].self_attn.qkv_proj

    def applies(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_caches: list) -> bool:
        rows = input_ids.shape[0]
        if not (rows and input_ids.is_cpu and kv_caches[0][0].dtype == torch.bfloat16):
            return False
        if meta.batch_invariant:
            return meta.row_block_tables is not None
        return meta.decode_only and rows <= self.first_proj.int4_max_rows()

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], cos_sin: torch.Tensor) -> torch.Tensor:
        """The embedded rows [T, H] -> the final hidden states [T, H]; this step's keys and values written."""
        if meta.batch_invariant:  # a row each, in parts of a fixed size (kernels/row_attention.py)
            block_tables, seq_lens, num_splits = meta.row_block_tables, meta.row_seq_lens, -ROW_SPLIT_TILES
        else:  # decode rows: a sequence each, the kernel's splits
            block_tables, seq_lens, num_splits = meta.block_tables, meta.seq_lens, 0
        if block_tables.stride(1) != 1:
            block_tables = block_tables.contiguous()
        return decode_stack_cpu.run(self.handle, hidden.contiguous(), positions.contiguous(),
                                    meta.slot_mapping.contiguous(), block_tables, seq_lens.contiguous(), cos_sin,
                                    [k for k, _ in kv_caches], [v for _, v in kv_caches], num_splits)
