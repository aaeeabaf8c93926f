"""Rotary position embedding, neox / HF-Llama "rotate_half" style.

cos_sin_cache[p] = cat(cos(p * inv_freq), sin(p * inv_freq)), float32,
[max_pos, head_dim]; the rotation covers the full head_dim.
"""

from __future__ import annotations

import torch


def build_cos_sin_cache(
    head_dim: int, max_pos: int, theta: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """[max_pos, head_dim] float32: the cos half, then the sin half."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    t = torch.arange(max_pos, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def rotary_embedding_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T], q [T, Hq, D], k [T, Hkv, D] -> rotated (q, k), float32 math."""
    half = q.shape[-1] // 2
    cs = cos_sin_cache.index_select(0, positions.long()).unsqueeze(1)  # [T, 1, D]
    cos, sin = cs[..., :half], cs[..., half:]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
