"""SiLU-and-multiply (the SwiGLU gate): out = silu(x[:, :I]) * x[:, I:]; and GELU(tanh)-and-multiply (Gemma's
MLP, GeGLU): out = gelu_tanh(x[:, :I]) * x[:, I:] (a reference here, the native CPU op in fused_ops_cpu)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import check, check_model_dtype, jit, kernel_for, next_pow2, tl, triton


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> [T, I] in x's dtype."""
    inter = x.shape[-1] // 2
    return F.silu(x[..., :inter]) * x[..., inter:]


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> [T, I] in x's dtype: transformers' Gemma3MLP, ``gelu_pytorch_tanh(gate) * up``."""
    inter = x.shape[-1] // 2
    return F.gelu(x[..., :inter], approximate="tanh") * x[..., inter:]


@jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, inter,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    # Round silu(gate) to the model dtype first, as the reference does.
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton launcher; same contract as ``silu_and_mul_ref``."""
    check(x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2I], got {tuple(x.shape)}")
    check(x.stride(1) == 1, "x rows must be contiguous")
    check_model_dtype("x", x)
    rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    if rows and inter:
        block = min(1024, next_pow2(inter))
        kernel_for(_silu_and_mul_kernel, x.device)[(rows, triton.cdiv(inter, block))](
            x, out, x.stride(0), out.stride(0), inter, BLOCK=block,
        )
    return out
