"""Hugging Face checkpoints: a directory with config.json and *.safetensors.

Supports LlamaForCausalLM (Llama 3.x "llama3" rope scaling included),
MistralForCausalLM (its `sliding_window` when set), Qwen2ForCausalLM (biases on
q/k/v), Qwen3ForCausalLM (per-head q/k norms) and Gemma3ForCausalLM
(model_type "gemma3_text"; inference.engine.gemma3_config reads its config, and
its norm weights are stored as 1 + weight in float32, see inference.engine.llama). Weights are renamed into our layout, fusing q/k/v and
gate/up. Any other rope scaling, sliding-window Qwen layers, partial rotary
embeddings or MLP biases are refused with a ValueError naming them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from . import gemma3_config
from .model_config import ModelConfig, RopeScaling

_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}
_GEMMA_NORMS = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "attn_output_norm",
                "pre_feedforward_layernorm": "post_attention_layernorm",
                "post_feedforward_layernorm": "mlp_output_norm"}  # transformers' name -> ours


def rope_from_hf(config: dict) -> tuple[float, RopeScaling | None]:
    """(rope_theta, the llama3 scaling or None) of a config.json, read as transformers' standardize_rope_params
    reads it (`rope_parameters`, or the older `rope_scaling` with a top-level `rope_theta`); a ValueError for
    a rope type we do not implement."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if any(isinstance(value, dict) for value in rope.values()):
        raise ValueError(f"per-layer-type rope parameters ({sorted(rope)}) are not supported")
    rope_type = rope.get("rope_type", rope.get("type")) or "default"
    theta = float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported")
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"rope scaling {rope_type!r} is not supported (supported: 'llama3')")
    # transformers prefers a top-level original_max_position_embeddings, then the rope dict's, then the context
    original = (config.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
                or config.get("max_position_embeddings"))
    try:
        return theta, RopeScaling("llama3", float(rope["factor"]), float(rope["low_freq_factor"]),
                                  float(rope["high_freq_factor"]), int(original))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"llama3 rope scaling lacks {exc}: {rope}") from None


def _llama_fields(config: dict, model_type: str) -> dict:
    rope_theta, rope_scaling = rope_from_hf(config)
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"activation {config.get('hidden_act')!r} is not supported")
    if model_type in ("qwen2", "qwen3") and config.get("use_sliding_window"):
        raise ValueError("sliding-window attention (use_sliding_window) is not supported")
    window = config.get("sliding_window") if model_type == "mistral" else None
    return dict(rope_theta=rope_theta, rope_scaling=rope_scaling, sliding_window=int(window) if window else None,
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)))


def config_from_hf(config: dict) -> ModelConfig:
    model_type = config.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(_MODEL_TYPES)}")
    if config.get("mlp_bias"):
        raise ValueError("MLP biases are not supported")
    gemma = model_type == "gemma3_text"
    fields = gemma3_config.fields_from_hf(config) if gemma else _llama_fields(config, model_type)
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    eos = config.get("eos_token_id")
    return ModelConfig(
        architecture=_MODEL_TYPES[model_type],
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        attention_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        **fields,
    )


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(path / name), framework="pt") as handle:
            for key in handle.keys():
                tensors[key] = handle.get_tensor(key)
    return tensors


def load_safetensors(path: str | Path, *, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state_dict in LlamaForCausalLM's parameter names) on the CPU, in `dtype`."""
    path = Path(path)
    config = config_from_hf(json.loads((path / "config.json").read_text()))
    raw = _read_tensors(path)
    prefix = "model." if "model.embed_tokens.weight" in raw else ""

    def get(name: str) -> torch.Tensor:
        tensor = raw.get(prefix + name)
        if tensor is None:
            raise KeyError(f"{path}: tensor {prefix + name} is missing")
        if config.gemma and name.endswith("norm.weight"):  # Gemma's norms scale by 1 + weight, kept in float32
            return gemma3_config.norm_weight(tensor, dtype)
        return tensor.to(dtype)

    state = {"embed_tokens.weight": get("embed_tokens.weight"), "norm.weight": get("norm.weight")}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = raw["lm_head.weight"].to(dtype)
    for i in range(config.num_layers):
        src, out = f"layers.{i}", f"layers.{i}"
        attn = f"{src}.self_attn"
        state[f"{out}.self_attn.qkv_proj.weight"] = torch.cat(
            [get(f"{attn}.{p}_proj.weight") for p in "qkv"])
        if config.attention_bias:
            state[f"{out}.self_attn.qkv_proj.bias"] = torch.cat([get(f"{attn}.{p}_proj.bias") for p in "qkv"])
        state[f"{out}.self_attn.o_proj.weight"] = get(f"{attn}.o_proj.weight")
        if config.qk_norm:
            state[f"{out}.self_attn.q_norm.weight"] = get(f"{attn}.q_norm.weight")
            state[f"{out}.self_attn.k_norm.weight"] = get(f"{attn}.k_norm.weight")
        state[f"{out}.mlp.gate_up_proj.weight"] = torch.cat(
            (get(f"{src}.mlp.gate_proj.weight"), get(f"{src}.mlp.up_proj.weight")))
        state[f"{out}.mlp.down_proj.weight"] = get(f"{src}.mlp.down_proj.weight")
        norms = _GEMMA_NORMS if config.gemma else {n: n for n in ("input_layernorm", "post_attention_layernorm")}
        for theirs, ours in norms.items():
            state[f"{out}.{ours}.weight"] = get(f"{src}.{theirs}.weight")
    return config, state
