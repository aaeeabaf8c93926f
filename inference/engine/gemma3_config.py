"""Gemma 3 (text) configs: from a Hugging Face config.json (`Gemma3ForCausalLM`, model_type "gemma3_text")
and from a GGUF header (architecture "gemma3"), into the fields ModelConfig adds for it.

Layer kinds: config.json's `layer_types` ("sliding_attention" / "full_attention"), else every
`sliding_window_pattern`-th layer global (default 6, transformers' rule). A GGUF names no pattern: llama.cpp
and transformers' GGUF loader both take 6. Rotary: the global layers use `rope_theta` (default 1e6) and the
scaling Gemma 3 ships ("linear", factor 8, on the 4B/12B/27B models); the local layers `rope_local_base_freq`
(default 1e4), unscaled. Any other rope type, attention-logit softcapping (Gemma 2's, which Gemma 3 does
not set) and bidirectional attention are refused by name. A GGUF holds no query_pre_attn_scalar: like
llama.cpp we take head_dim, hidden_size / heads for the 27B model (62 layers) whose config says so.
"""

from __future__ import annotations

from .model_config import RopeScaling

LAYER_TYPES = ("sliding_attention", "full_attention")
DEFAULT_PATTERN = 6
DEFAULT_GLOBAL_THETA, DEFAULT_LOCAL_THETA = 1_000_000.0, 10_000.0
_GEMMA3_27B_LAYERS = 62


def sliding_layers(num_layers: int, layer_types=None, pattern: int | None = None) -> tuple[bool, ...]:
    """Which layers are local (sliding-window), as transformers' Gemma3TextConfig decides."""
    if layer_types is None:
        pattern = int(pattern or DEFAULT_PATTERN)
        return tuple(bool((i + 1) % pattern) for i in range(num_layers))
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"layer types {unknown} are not supported (supported: {list(LAYER_TYPES)})")
    if len(layer_types) != num_layers:
        raise ValueError(f"{len(layer_types)} layer_types for {num_layers} layers")
    return tuple(kind == "sliding_attention" for kind in layer_types)


def _scaling(params: dict, where: str) -> RopeScaling | None:
    rope_type = params.get("rope_type", params.get("type")) or "default"
    if rope_type == "default":
        return None
    if rope_type != "linear" or where != "global":
        raise ValueError(f"rope scaling {rope_type!r} on Gemma 3's {where} layers is not supported "
                         "(supported: 'linear' on the global layers)")
    return RopeScaling("linear", factor=float(params["factor"]))


def rope_from_hf(config: dict) -> tuple[float, RopeScaling | None, float]:
    """(global theta, global scaling, local theta): transformers 5's per-layer-type `rope_parameters`, or the
    older `rope_theta` / `rope_scaling` (global) / `rope_local_base_freq`."""
    rope = config.get("rope_parameters") or {}
    if rope and all(isinstance(value, dict) for value in rope.values()):
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    else:
        full = dict(config.get("rope_scaling") or rope)
        full.setdefault("rope_theta", config.get("rope_theta"))
        local = {"rope_theta": config.get("rope_local_base_freq")}
    _scaling(local, "local")  # refuses any scaling there
    for params in (full, local):
        partial = params.get("partial_rotary_factor")
        if partial not in (None, 1, 1.0):
            raise ValueError(f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported")
    return (float(full.get("rope_theta") or DEFAULT_GLOBAL_THETA), _scaling(full, "global"),
            float(local.get("rope_theta") or DEFAULT_LOCAL_THETA))


def fields_from_hf(config: dict) -> dict:
    """ModelConfig's keyword arguments particular to Gemma 3, from a config.json."""
    if config.get("attn_logit_softcapping") is not None:
        raise ValueError("attention logit softcapping (attn_logit_softcapping) is not supported")
    if config.get("use_bidirectional_attention"):
        raise ValueError("bidirectional attention (use_bidirectional_attention) is not supported")
    activation = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ValueError(f"activation {activation!r} is not supported (Gemma 3: 'gelu_pytorch_tanh')")
    theta, scaling, local_theta = rope_from_hf(config)
    layers = int(config["num_hidden_layers"])
    window = config.get("sliding_window")
    final_cap = config.get("final_logit_softcapping")
    return dict(
        rope_theta=theta, rope_scaling=scaling, rope_local_theta=local_theta,
        sliding_window=int(window) if window else None,
        sliding_layers=sliding_layers(layers, config.get("layer_types"), config.get("sliding_window_pattern")),
        query_pre_attn_scalar=float(config.get("query_pre_attn_scalar") or 256),
        final_logit_softcapping=float(final_cap) if final_cap is not None else None,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
    )


def fields_from_gguf(metadata: dict, layers: int, hidden: int, heads: int, head_dim: int) -> dict:
    """ModelConfig's keyword arguments particular to Gemma 3, from a GGUF header (llama.cpp's keys)."""
    if metadata.get("gemma3.attn_logit_softcapping") is not None:
        raise ValueError("attention logit softcapping (attn_logit_softcapping) is not supported")
    scaling_type = metadata.get("gemma3.rope.scaling.type")
    scaling = None
    if scaling_type not in (None, "none"):
        scaling = _scaling({"rope_type": scaling_type, "factor": metadata.get("gemma3.rope.scaling.factor")},
                           "global")
    window = metadata.get("gemma3.attention.sliding_window")
    final_cap = metadata.get("gemma3.final_logit_softcapping")
    return dict(
        rope_scaling=scaling, rope_local_theta=DEFAULT_LOCAL_THETA,
        sliding_window=int(window) if window else None, sliding_layers=sliding_layers(layers),
        query_pre_attn_scalar=float(hidden // heads if layers == _GEMMA3_27B_LAYERS else head_dim),
        final_logit_softcapping=float(final_cap) if final_cap is not None else None,
    )


def norm_weight(weight, dtype):
    """A Gemma norm's weight w (a torch tensor) -> the float32 1 + w the model multiplies by: w rounded to the
    model's `dtype` first, then 1 + it in float32, as transformers' Gemma3RMSNorm computes
    ``1.0 + self.weight.float()`` with its weight in the model's dtype. Kept in float32 so that a 16-bit
    model rounds the norm's output once (kernels/rms_norm.py), not the weight and then the product."""
    import torch

    return weight.to(dtype).to(torch.float32) + 1.0
