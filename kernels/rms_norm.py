"""RMSNorm and RMSNorm fused with the residual add (Llama style).

out = weight * (x / sqrt(mean(x^2) + eps)), the statistics in float32.
"""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H], weight [H] -> [T, H] in x's dtype (HF Llama rounding order)."""
    xf = x.float()
    variance = xf.square().mean(-1, keepdim=True)
    normed = (xf * torch.rsqrt(variance + eps)).to(x.dtype)
    return normed * weight.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """new_residual = x + residual (in the model dtype); out = rms_norm(new_residual)."""
    new_residual = x + residual
    return rms_norm_ref(new_residual, weight, eps), new_residual
