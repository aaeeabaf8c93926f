"""Rotary frequencies and the cos/sin cache of a ModelConfig, scaled rope (Llama 3.x "llama3") included.

Unscaled, the cache is the kernel set's own `build_cos_sin_cache`. Scaled, the inverse frequencies are computed
as transformers' `_compute_llama3_parameters` computes them (same float32 operations in the same order, so the
same bits): low frequencies (wavelength above original_max_position_embeddings / low_freq_factor) divided by
`factor`, high ones (wavelength below ... / high_freq_factor) kept, those between interpolated. A GGUF carries
the same scaling as llama.cpp's per-frequency divisors (`rope_freqs.weight`, written by its converter from
those four parameters in float64): inverse frequency i is then theta^(-2i/D) / freq_factors[i], as llama.cpp
computes it (within a float32 rounding of transformers' value, not bit for bit).

"linear" scaling (Gemma 3's global layers) divides every inverse frequency by its factor, as transformers does.
Gemma 3's local (sliding-window) layers have their own base, `rope_local_theta`, and no scaling: `local=True`.

The cache layout is the kernels' ([max_pos, head_dim] float32: the cos half, then the sin half).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kernels.dispatch import get_ops

from .model_config import ModelConfig, RopeScaling


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[head_dim / 2] float32: theta^(-2i/head_dim), as transformers and kernels.rotary compute it."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """transformers' llama3 scaling of `inv_freq` (float32), operation for operation."""
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def inv_freq(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """The model's rotary inverse frequencies, [head_dim / 2] float32 on the CPU (its local layers' with
    `local`)."""
    if local:
        return default_inv_freq(config.head_dim, config.rope_local_theta or config.rope_theta)
    base = default_inv_freq(config.head_dim, config.rope_theta)
    scaling = config.rope_scaling
    if scaling is None:
        return base
    if scaling.rope_type == "linear":
        return base / scaling.factor
    if scaling.freq_factors is not None:
        return base / torch.tensor(scaling.freq_factors, dtype=torch.float32)
    if not scaling.from_params:
        raise ValueError("llama3 rope scaling without its parameters or frequency factors (a GGUF header's "
                         "config: load the model to read its rope_freqs tensor)")
    return llama3_inv_freq(base, scaling)


def build_cos_sin_cache(config: ModelConfig, device: torch.device, local: bool = False) -> torch.Tensor:
    """[max_position_embeddings, head_dim] float32 on `device`: cos of position x inverse frequency, then sin
    (for the local layers with `local`)."""
    theta = (config.rope_local_theta or config.rope_theta) if local else config.rope_theta
    if config.rope_scaling is None or local:
        return get_ops(device).build_cos_sin_cache(config.head_dim, config.max_position_embeddings, theta, device)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.int64).float()
    freqs = torch.outer(positions, inv_freq(config))
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


def with_freq_factors(config: ModelConfig, factors: torch.Tensor) -> ModelConfig:
    """`config` with llama.cpp's per-frequency rope divisors (a GGUF's `rope_freqs.weight`, any float dtype)."""
    values = tuple(float(v) for v in factors.to(torch.float32).reshape(-1).tolist())
    scaling = config.rope_scaling or RopeScaling()
    return dataclasses.replace(config, rope_scaling=dataclasses.replace(scaling, freq_factors=values))
