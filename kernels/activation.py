"""SiLU-and-multiply (the SwiGLU gate): out = silu(x[:, :I]) * x[:, I:]."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> [T, I] in x's dtype."""
    inter = x.shape[-1] // 2
    return F.silu(x[..., :inter]) * x[..., inter:]
