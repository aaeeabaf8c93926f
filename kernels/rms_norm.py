"""RMSNorm and RMSNorm fused with the residual add.

out = weight * (x / sqrt(mean(x^2) + eps)), the statistics in float32. The
weight's dtype says where a 16-bit x is rounded: a weight in x's dtype
multiplies the normalised row already rounded to that dtype (HF Llama:
``weight * x.to(dtype)``); a float32 weight with a 16-bit x (Gemma 3, whose
norms scale by 1 + weight, kept in float32 by the loaders) multiplies the
float32 normalised row, and the product is rounded once (transformers'
Gemma3RMSNorm: ``(x_norm * (1.0 + w.float())).type_as(x)``). In float32 the
two are the same.
"""

from __future__ import annotations

import torch

from kernels._triton import check, check_model_dtype, check_same_device, jit, kernel_for, next_pow2, tl


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H], weight [H] -> [T, H] in x's dtype (rounding order: see the module docstring)."""
    xf = x.to(torch.float32, copy=True)  # a private copy: scaled in place below
    variance = xf.square().mean(-1, keepdim=True)
    normed = xf.mul_(variance.add_(eps).rsqrt_())
    if weight.dtype == torch.float32:  # Gemma: one rounding, after the weight
        return normed.mul_(weight).to(x.dtype)
    return normed.to(x.dtype).mul_(weight.to(x.dtype))


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """new_residual = x + residual (in the model dtype); out = rms_norm(new_residual)."""
    new_residual = x + residual
    return rms_norm_ref(new_residual, weight, eps), new_residual


@jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
    stride_x, stride_r, stride_o, stride_n,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr, WEIGHT_F32: tl.constexpr, BLOCK: tl.constexpr,
):
    # One program per row. Rounding follows the reference: the residual sum is rounded to the model
    # dtype; so is the normalised row before the weight, unless the weight is float32 (Gemma).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(new_res_ptr.dtype.element_ty)
        tl.store(new_res_ptr + row * stride_n + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden
    normed = x * tl.rsqrt(variance + eps)
    if WEIGHT_F32:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    else:
        normed = normed.to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x, residual, weight, eps):
    device = check_same_device(x, weight, *([residual] if residual is not None else []))
    check(x.dim() == 2, f"x must be [T, H], got {tuple(x.shape)}")
    check_model_dtype("x", x)
    check(weight.shape == (x.shape[1],), f"weight must be [{x.shape[1]}], got {tuple(weight.shape)}")
    check(x.stride(1) == 1 and weight.is_contiguous(), "x rows and weight must be contiguous")
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x")
        check(residual.stride(1) == 1, "residual rows must be contiguous")
    rows, hidden = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_res = torch.empty_like(out) if residual is not None else out
    if rows:
        block = next_pow2(hidden)
        kernel_for(_rms_norm_kernel, device)[(rows,)](
            x, residual if residual is not None else x, weight, out, new_res,
            x.stride(0), (residual if residual is not None else x).stride(0),
            out.stride(0), new_res.stride(0), hidden, float(eps),
            HAS_RESIDUAL=residual is not None, WEIGHT_F32=weight.dtype == torch.float32, BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    return out, new_res


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton launcher; same contract as ``rms_norm_ref``."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher; same contract as ``fused_add_rms_norm_ref``."""
    return _launch(x, residual, weight, eps)
