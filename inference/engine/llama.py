"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 3) over a paged KV cache.

Inputs are a flattened batch of T tokens from any mix of sequences; the
per-step AttentionMetadata says which tokens belong to which sequence and
where their keys/values live. Norms, rotary embeddings, the SwiGLU activation
and attention go through `kernels.dispatch.get_ops(device)`; the model itself
only holds weights and runs the matmuls. Q/K/V and gate/up are fused into one
Linear each, so a layer is four matmuls. Submodules are called through
`.forward` directly: the model uses no hooks, and skipping nn.Module.__call__
saves ~300 Python calls per decode step. Those Linears may also carry a packed
4-bit copy of their weight for few-row (decode) inputs; see packed_linear. On
CUDA they may be swapped for fp8 ones (fp8_linear). The forward is also split at
attention (`LlamaDecoderLayer.input_norm`, `LlamaAttention.project`,
`LlamaDecoderLayer.after_attention`), the same ops in the same order, so that
prefill_graphs can capture the parts between attentions. Qwen3's per-head q/k
RMSNorm (config.qk_norm) runs in `project` between the fused QKV matmul and the
rotary embedding: one norm kernel each over the [T * heads, head_dim] rows. The
rotary cos/sin cache, scaled for Llama 3.x where the config says so, comes from
inference.engine.rope. On the CPU a bf16 model whose projections all have their
int4 copies hands few-row decode steps (and every batch-invariant step) to one
native call that runs the same kernels in the same order (inference.engine.native_stack):
the same bits without ~300 Python-level calls a step.

Gemma 3 (config.gemma) is the same pipeline with four changes: the embeddings are
scaled by sqrt(hidden_size) (rounded to the model's dtype, as transformers does);
each layer also normalises the attention block's output (`attn_output_norm`)
and the MLP's (`mlp_output_norm`) before they join the residual stream, the
pre-MLP norm keeping Llama's name `post_attention_layernorm`; the MLP is
GELU(tanh)-and-multiply; and attention is scaled by query_pre_attn_scalar^-0.5.
Gemma's norms multiply by (1 + weight): the loaders store 1 + weight in float32
(gemma3_config.norm_weight), so every norm here runs the same kernel, which then
rounds a 16-bit row once, after the weight, as transformers does (kernels/rms_norm.py). Sliding-window layers (Gemma 3's local ones,
all of Mistral's when it sets `sliding_window`) attend to their last `window`
positions (PagedAttention) and, in Gemma 3, take their own rotary cache
(`rope_local_theta`). A config's `final_logit_softcapping` caps the logits.

Parameter names (what the loaders produce):
  embed_tokens.weight, norm.weight, lm_head.weight (absent when tied),
  layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight,
  layers.{i}.self_attn.qkv_proj.weight (+ .bias for Qwen2), layers.{i}.self_attn.o_proj.weight,
  layers.{i}.self_attn.q_norm.weight, layers.{i}.self_attn.k_norm.weight ([head_dim], Qwen3 only),
  layers.{i}.mlp.gate_up_proj.weight, layers.{i}.mlp.down_proj.weight,
  layers.{i}.attn_output_norm.weight, layers.{i}.mlp_output_norm.weight (Gemma 3 only)
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.dispatch import get_ops

from . import cpu_matmul, native_stack, packed_linear, rope
from .attention import PagedAttention
from .attention_metadata import AttentionMetadata
from .model_config import ModelConfig
from .packed_linear import Int8Blocks, Linear


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, config.attention_scale,
                                   config.layer_window(layer))
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, cos_sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, ops) -> torch.Tensor:
        mm = ops.fixed_matmul if meta.batch_invariant else None
        q = self.project(positions, hidden, cos_sin, kv_cache, meta.slot_mapping, ops, mm)
        return self.o_proj.forward(self.attn.forward(q, kv_cache, meta, ops), mm)

    def project(self, positions: torch.Tensor, hidden: torch.Tensor, cos_sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor, ops,
                mm=None, **q_out) -> torch.Tensor:
        """Everything before attention: -> rotated q [T, Hq, D]; the rotated k and v written into this
        layer's cache blocks (one kernel on the GPU). Row-wise throughout (no step metadata but the slots),
        which is what lets inference.engine.prefill_graphs capture it. ``q_out``: the Triton kernel set's
        optional output buffer for q."""
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj.forward(hidden, mm).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        if self.q_norm is not None:  # Qwen3, Gemma 3: RMSNorm over each head's head_dim values (rows of [T * H, D])
            q = ops.rms_norm(q.reshape(-1, self.head_dim), self.q_norm.weight, self.q_norm.eps)
            k = ops.rms_norm(k.reshape(-1, self.head_dim), self.k_norm.weight, self.k_norm.eps)
        return ops.rotary_and_store_kv(positions, q.view(tokens, self.num_heads, self.head_dim),
                                       k.view(tokens, self.num_kv_heads, self.head_dim),
                                       v.view(tokens, self.num_kv_heads, self.head_dim), cos_sin, *kv_cache,
                                       slot_mapping, **q_out)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gelu = config.gemma  # GELU(tanh) instead of SiLU
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, ops, mm=None) -> torch.Tensor:
        """``mm``: ``ops.fixed_matmul`` in batch-invariant mode, else None (see packed_linear.Linear)."""
        gate_up = self.gate_up_proj.forward(hidden, mm)
        act = ops.gelu_tanh_and_mul(gate_up) if self.gelu else ops.silu_and_mul(gate_up)
        return self.down_proj.forward(act, mm)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        gemma = config.gemma  # norms of the attention's and the MLP's outputs
        self.attn_output_norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if gemma else None
        self.mlp_output_norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if gemma else None

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                cos_sin: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                ops) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.input_norm(hidden, residual, ops)
        hidden = self.self_attn.forward(positions, hidden, cos_sin, kv_cache, meta, ops)
        return self.after_attention(hidden, residual, ops, ops.fixed_matmul if meta.batch_invariant else None)

    def input_norm(self, hidden: torch.Tensor, residual: torch.Tensor | None, ops) -> tuple[torch.Tensor, torch.Tensor]:
        norm = self.input_layernorm
        if residual is None:
            return ops.rms_norm(hidden, norm.weight, norm.eps), hidden
        return ops.fused_add_rms_norm(hidden, residual, norm.weight, norm.eps)

    def after_attention(self, hidden: torch.Tensor, residual: torch.Tensor, ops,
                        mm=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden``: the attention block's output (after o_proj) -> (the MLP's output, residual)."""
        if (out_norm := self.attn_output_norm) is not None:
            hidden = ops.rms_norm(hidden, out_norm.weight, out_norm.eps)
        norm = self.post_attention_layernorm
        hidden, residual = ops.fused_add_rms_norm(hidden, residual, norm.weight, norm.eps)
        hidden = self.mlp.forward(hidden, ops, mm)
        if (out_norm := self.mlp_output_norm) is not None:
            hidden = ops.rms_norm(hidden, out_norm.weight, out_norm.eps)
        return hidden, residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                           bias=False)
        self._cos_sin: dict[tuple[torch.device, bool], torch.Tensor] = {}
        self._embed_scales: dict[torch.dtype, float] = {}
        # Gemma 3's local layers take their own rotary cache
        self.local_rope = [config.gemma and config.layer_window(i) > 0 for i in range(config.num_layers)]
        self.output_int8: Int8Blocks | None = None  # the output weight as exact int8 blocks (few-row LM head)
        self.output_prepacked: torch.Tensor | None = None  # oneDNN-blocked copy (cpu_matmul.prepack)
        # inference.engine.native_stack: the stack in one native call for few-row CPU decode steps; None: not
        # decided yet, False: the model is not one it computes
        self.native_stack: native_stack.NativeStack | bool | None = None
        self.output_fp8 = None  # an fp8 copy of the output weight (fp8_linear.Fp8Head, EngineConfig.fp8_lm_head)

    def cos_sin_cache(self, device: torch.device, local: bool = False) -> torch.Tensor:
        cache = self._cos_sin.get((device, local))
        if cache is None:
            cache = rope.build_cos_sin_cache(self.config, device, local)
            self._cos_sin[(device, local)] = cache
        return cache

    def layer_cos_sin(self, device: torch.device) -> list[torch.Tensor]:
        """Each layer's rotary cache."""
        return [self.cos_sin_cache(device, local) for local in self.local_rope]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens.forward(input_ids)
        if self.config.gemma:
            return hidden * self._embed_scale(hidden.dtype)
        return hidden

    def _embed_scale(self, dtype: torch.dtype) -> float:
        """Gemma's sqrt(hidden_size) rounded to the weights' dtype first, as transformers does; once per dtype
        (building that scalar tensor on every forward cost a decode step a few tensor ops)."""
        scale = self._embed_scales.get(dtype)
        if scale is None:
            scale = self._embed_scales[dtype] = float(torch.tensor(self.config.hidden_size ** 0.5).to(dtype))
        return scale

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """input_ids/positions [T] int64 -> final hidden states [T, H] (after the last norm)."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} KV caches, got {len(kv_caches)}")
        device = input_ids.device
        stack = self.native_stack
        if stack is None:  # decided once, at the first forward (the packed copies are attached by then)
            stack = self.native_stack = native_stack.NativeStack(self) if native_stack.eligible(self) else False
        if stack and stack.applies(input_ids, meta, kv_caches):
            return stack.forward(self.embed(input_ids), positions, meta, kv_caches, self.cos_sin_cache(device))
        ops = get_ops(device)
        hidden = self.embed(input_ids)
        residual = None
        for layer, kv_cache, cos_sin in zip(self.layers, kv_caches, self.layer_cos_sin(device)):
            hidden, residual = layer.forward(positions, hidden, residual, cos_sin, kv_cache, meta, ops)
        hidden, _ = ops.fused_add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)
        return hidden

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def attach_int8_head(self, blocks: Int8Blocks) -> None:
        """Use `blocks` (which must describe output_weight exactly) for LM heads of few rows."""
        if tuple(blocks.codes.shape) != tuple(self.output_weight.shape):
            raise ValueError(f"int8 head {tuple(blocks.codes.shape)} does not match the output weight "
                             f"{tuple(self.output_weight.shape)}")
        self.output_int8 = blocks

    def prepack(self) -> None:
        """Give every Linear and the LM head a oneDNN-blocked weight copy where that applies (see cpu_matmul)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.prepack()
        self.output_prepacked = cpu_matmul.prepack(self.output_weight)

    def compute_logits(self, hidden: torch.Tensor, batch_invariant: bool = False) -> torch.Tensor:
        """hidden [N, H] (only the rows that need logits) -> float32 logits [N, V]. ``batch_invariant``:
        one kernel for every N, reducing each row in one order: the int8 head's native kernel where the
        model has one (its rows never interact), else the kernel set's fixed matmul."""
        logits = self._logits(hidden, batch_invariant)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _logits(self, hidden: torch.Tensor, batch_invariant: bool) -> torch.Tensor:
        if batch_invariant:
            if self.output_int8 is not None and hidden.is_cpu:
                return self.output_int8.matmul(hidden)
            return get_ops(hidden.device).fixed_matmul(hidden, self.output_weight, torch.float32)
        if self.output_fp8 is not None:
            return self.output_fp8.logits(hidden)
        if self.output_int8 is not None and hidden.shape[0] <= packed_linear.INT8_MAX_ROWS and hidden.is_cpu:
            return self.output_int8.matmul(hidden)
        if self.output_prepacked is not None and hidden.dim() == 2 and hidden.dtype == self.output_weight.dtype:
            return cpu_matmul.prepacked_linear(hidden, self.output_prepacked).float()
        return cpu_matmul.linear(hidden, self.output_weight).float()
