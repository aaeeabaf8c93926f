"""Gemma 3's RMSNorm in bfloat16: our norm kernels, given the float32 1 + weight the loaders keep
(gemma3_config.norm_weight), equal transformers' Gemma3RMSNorm in bfloat16 bit for bit: the normalised row
times 1 + weight in float32, rounded once. (Rounding 1 + weight to bfloat16 first, and the product again,
as a bf16 weight would, differs from it in the last bits of many elements.)"""

from __future__ import annotations

import pytest
import torch

from inference.engine.gemma3_config import norm_weight
from kernels import fused_ops_cpu
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref

SHAPES = [(1, 8), (3, 16), (5, 40), (2, 256), (7, 640)]


def _hf_norm(hidden: int, seed: int):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(hidden, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=torch.Generator().manual_seed(seed)) * 0.5)
    return norm.to(torch.bfloat16)


def _ops():
    if fused_ops_cpu.library() is None:
        return [rms_norm_ref]
    return [rms_norm_ref, fused_ops_cpu.rms_norm_cpu]


@pytest.mark.parametrize("rows,hidden", SHAPES)
def test_gemma_norm_bf16_equals_transformers_bit_for_bit(rows, hidden):
    hf = _hf_norm(hidden, seed=rows * 1000 + hidden)
    weight = norm_weight(hf.weight.detach(), torch.bfloat16)
    assert weight.dtype == torch.float32
    x = (torch.randn(rows, hidden, generator=torch.Generator().manual_seed(hidden)) * 3).to(torch.bfloat16)
    with torch.no_grad():
        want = hf(x)
    for op in _ops():
        got = op(x, weight, 1e-6)
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want), op.__name__


@pytest.mark.parametrize("rows,hidden", SHAPES)
def test_gemma_fused_add_norm_bf16_equals_transformers_bit_for_bit(rows, hidden):
    """transformers adds the residual in bfloat16 (`residual + hidden_states`), then normalises."""
    hf = _hf_norm(hidden, seed=hidden)
    weight = norm_weight(hf.weight.detach(), torch.bfloat16)
    gen = torch.Generator().manual_seed(rows)
    x, residual = (torch.randn(2, rows, hidden, generator=gen) * 2).to(torch.bfloat16)
    summed = residual + x
    with torch.no_grad():
        want = hf(summed)
    fused = [fused_add_rms_norm_ref] + ([fused_ops_cpu.fused_add_rms_norm_cpu]
                                        if fused_ops_cpu.library() is not None else [])
    for op in fused:
        got, new_residual = op(x, residual, weight, 1e-6)
        assert torch.equal(new_residual, summed), op.__name__
        assert torch.equal(got, want), op.__name__


def test_a_bf16_weight_keeps_llama_rounding():
    """A weight in the row's dtype multiplies the row already rounded to it (HF Llama), as before."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    w = torch.randn(64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    xf = x.float()
    want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w
    assert torch.equal(rms_norm_ref(x, w, 1e-6), want)
