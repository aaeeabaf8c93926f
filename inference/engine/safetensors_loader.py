"""Hugging Face checkpoints: a directory with config.json and *.safetensors.

Supports LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (biases
on q/k/v). Weights are renamed into our layout, fusing q/k/v and gate/up.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .model_config import ModelConfig

_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}


def config_from_hf(config: dict) -> ModelConfig:
    model_type = config.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(_MODEL_TYPES)}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ValueError(f"rope scaling {rope_type!r} is not supported")
    if config.get("mlp_bias"):
        raise ValueError("MLP biases are not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"activation {config.get('hidden_act')!r} is not supported")
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
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        bos_token_id=config.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
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
        state[f"{out}.mlp.gate_up_proj.weight"] = torch.cat(
            (get(f"{src}.mlp.gate_proj.weight"), get(f"{src}.mlp.up_proj.weight")))
        state[f"{out}.mlp.down_proj.weight"] = get(f"{src}.mlp.down_proj.weight")
        state[f"{out}.input_layernorm.weight"] = get(f"{src}.input_layernorm.weight")
        state[f"{out}.post_attention_layernorm.weight"] = get(f"{src}.post_attention_layernorm.weight")
    return config, state
