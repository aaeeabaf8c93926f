"""fp8 (E4M3) weights for the decoder's linear layers on CUDA (`EngineConfig.fp8_weights`).

Decoding at small batch reads every weight once per step, so a layer takes as
long as its weight takes to stream: E4M3 codes with one float32 scale per output
channel halve that (kernels/fp8_matmul.py). `attach_fp8` swaps each layer's four
Linears (qkv, o, gate_up, down) for `Fp8Linear`, which multiplies few-row inputs
by the codes directly (weight-only: activations stay bf16) and many-row inputs
through `torch._scaled_mm` with the activations quantised per row (W8A8: fp8
tensor cores for prefill and large batches). With ``lm_head`` the output
projection (tied to the embedding in the models here: the embedding itself stays
bf16) gets an fp8 copy too.

The dense bf16 weight stays on each layer (`Fp8Linear.weight`): batch-invariant
mode multiplies by it (the two modes do not combine: EngineConfig refuses it),
and it keeps the state dict's names. So fp8 here buys bandwidth, not memory.

Quality and speed against bf16 on the same random-weight models:
benchmarks/gpu_fp8.py (logit error, greedy agreement, decode steps at batch 1
and 256); BENCHMARKS.md has the figures.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import fp8_matmul

from .packed_linear import Linear


class Fp8Linear(nn.Module):
    """A Linear whose products read E4M3 codes with per-output-channel scales."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.weight = linear.weight  # the dense weight: batch-invariant products and the state dict
        self.bias = linear.bias
        codes, scale = fp8_matmul.quantize_weight(linear.weight.detach())
        self.register_buffer("codes", codes, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.scale_row = scale.view(1, -1)  # as torch._scaled_mm takes it
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.w8a8 = fp8_matmul.w8a8_shape_ok(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor, fixed=None) -> torch.Tensor:
        if fixed is not None:
            out = fixed(x, self.weight)
        elif x.shape[0] <= fp8_matmul.WEIGHT_ONLY_MAX_ROWS:
            out = fp8_matmul.fp8_weight_only_matmul(x, self.codes, self.scale)
        elif self.w8a8:
            out = fp8_matmul.fp8_w8a8_matmul(x, self.codes.t(), self.scale_row)
        else:  # a shape _scaled_mm does not take (N or K not a multiple of 16): the dense weight
            out = torch.nn.functional.linear(x, self.weight)
        return out if self.bias is None else out + self.bias


class Fp8Head:
    """The LM head's fp8 copy: float32 logits from E4M3 codes of the output weight."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.codes, self.scale = fp8_matmul.quantize_weight(weight.detach())
        self.scale_row = self.scale.view(1, -1)
        self.w8a8 = fp8_matmul.w8a8_shape_ok(*weight.shape)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[0] <= fp8_matmul.WEIGHT_ONLY_MAX_ROWS:
            out = fp8_matmul.fp8_weight_only_matmul(hidden, self.codes, self.scale)
        elif self.w8a8:
            out = fp8_matmul.fp8_w8a8_matmul(hidden, self.codes.t(), self.scale_row)
        else:
            out = torch.nn.functional.linear(hidden, self.weight)
        return out.float()


PROJECTIONS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


def check_fp8(device: torch.device, dtype: torch.dtype) -> None:
    """A ValueError unless fp8 weights can run here (bf16 on a CUDA GPU of compute capability 8.9+)."""
    if dtype != torch.bfloat16:
        raise ValueError(f"fp8 weights take a bfloat16 model (their products come out in bf16), not {dtype}")
    if not fp8_matmul.fp8_available(device):
        raise ValueError(f"fp8 weights need a CUDA GPU with fp8 tensor cores (compute capability 8.9+, "
                         f"e.g. an H100) and Triton; {device} has none")


def has_fp8(model) -> bool:
    return any(isinstance(getattr(getattr(layer, group), name), Fp8Linear)
               for layer in model.layers for group, name in PROJECTIONS) or model.output_fp8 is not None


@torch.no_grad()
def attach_fp8(model, *, layers: bool = True, lm_head: bool = False) -> None:
    """Give every decoder layer's four Linears fp8 codes when ``layers``, and the LM head when ``lm_head``
    (in place; idempotent). The model must be bfloat16 on a device where `check_fp8` passes."""
    check_fp8(model.embed_tokens.weight.device, model.embed_tokens.weight.dtype)
    for layer in model.layers if layers else ():
        for group, name in PROJECTIONS:
            parent = getattr(layer, group)
            linear = getattr(parent, name)
            if not isinstance(linear, Fp8Linear):
                setattr(parent, name, Fp8Linear(linear))
    if lm_head and model.output_fp8 is None:
        model.output_fp8 = Fp8Head(model.output_weight)
