"""`load_model`: a registered name or a path -> config, weights on the device, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gguf_loader import load_gguf
from .llama import LlamaForCausalLM
from .model_config import ModelConfig
from .packed_linear import Int4Groups, Int8Blocks, Q5Blocks, int4_supported, int8_supported
from .registry import ModelSource, resolve_model
from .safetensors_loader import load_safetensors
from .tokenizer import Tokenizer, load_tokenizer

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer | None  # None only for a safetensors directory without tokenizer.json
    source: ModelSource
    dtype: torch.dtype
    device: torch.device

    @property
    def max_model_len(self) -> int:
        return self.source.context_length or self.config.max_position_embeddings


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}") from None


def build_model(config: ModelConfig, state: dict[str, torch.Tensor], device: torch.device,
                packed: dict[str, Int4Groups | Int8Blocks | Q5Blocks] | None = None) -> LlamaForCausalLM:
    """Instantiate without initialising weights, adopt the loaded tensors, attach packed copies."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    model = model.to(device).eval()
    for name, groups in (packed or {}).items():
        if name == "lm_head":
            model.attach_int8_head(groups)
        elif isinstance(groups, (Int8Blocks, Q5Blocks)):
            model.get_submodule(name).attach_int8(groups)
        else:
            model.get_submodule(name).attach_int4(groups)
    model.prepack()
    return model


def load_model(name_or_path: str, *, dtype: torch.dtype | str = torch.bfloat16,
               device: torch.device | str = "cpu", int4_decode: bool = True) -> LoadedModel:
    """Load weights (dequantised to `dtype`) onto `device`, with the model's tokenizer.

    `int4_decode`: on the CPU in bf16/fp16, also keep Q4_0/Q4_1/Q4_K GGUF weights packed for few-row
    matmuls (decode), and (bf16) a Q8_0/Q5_0/Q4_0/Q6_K output weight as int8 blocks for the LM head at few
    rows and the other Q8_0/Q5_0/Q4_0 (or Q6_K) Linears as int8 blocks; no effect in float32 or on other
    devices.
    """
    source = resolve_model(name_or_path)
    dtype, device = resolve_dtype(dtype), torch.device(device)
    packed: dict[str, Int4Groups | Int8Blocks | Q5Blocks] = {}
    if source.kind == "gguf":
        config, state, packed = load_gguf(source.path, dtype=dtype,
                                          int4=int4_decode and int4_supported(device, dtype),
                                          int8_head=int4_decode and int8_supported(device, dtype),
                                          int8=int4_decode and int8_supported(device, dtype))
    elif source.kind == "safetensors":
        config, state = load_safetensors(source.path, dtype=dtype)
    else:
        raise ValueError(f"unknown model source kind {source.kind!r}")
    model = build_model(config, state, device, packed)
    try:
        tokenizer = load_tokenizer(name_or_path)
    except FileNotFoundError:
        tokenizer = None
    return LoadedModel(config=config, model=model, tokenizer=tokenizer, source=source, dtype=dtype, device=device)
