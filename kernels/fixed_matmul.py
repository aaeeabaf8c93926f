"""The batch-invariant matmul on CUDA: one tile configuration for every shape.

cuBLAS picks its kernel, tiles and split-K from (M, N, K), so the rows of a
step are reduced differently when the step has more rows: the same request
gives other tokens under load (inference/engine/invariant_mode.py). This
kernel always runs one configuration: output tiles of BLOCK_M x BLOCK_N, the K
axis walked from 0 in steps of BLOCK_K inside one program (no split-K), fp32
accumulators, one rounding at the store. A row's outputs are then reduced in
the same order whatever the row count and whichever tile row it lands in.
``fixed_matmul_ref`` is the same product in plain PyTorch (equal up to
summation order); the CPU has its own kernel (kernels/fixed_matmul_cpu.py).
"""

from __future__ import annotations

import torch

from kernels._triton import check, check_model_dtype, check_same_device, dot_dtype, dot_precision, jit, kernel_for, tl, triton

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32


def fixed_matmul_ref(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T in float32, rounded once to ``out_dtype`` (x's by default)."""
    return (x.float() @ weight.float().t()).to(out_dtype or x.dtype)


def fixed_matmul_rows(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The reference kernel set's batch-invariant matmul: ``fixed_matmul_ref`` one row at a time, so that
    every row takes the same (one-row) path of the library GEMM. Slow; the fallback where neither the
    native CPU kernels nor Triton run."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=out_dtype or x.dtype, device=x.device)
    wf = weight.float()
    for row in range(x.shape[0]):
        out[row] = (x[row:row + 1].float() @ wf.t())[0]
    return out


@jit
def _fixed_matmul_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K,
    stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        x = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :],
                    mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[None, :] * stride_wn + kk[:, None],
                    mask=(cols[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc += tl.dot(x.to(DOT_DTYPE), w.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def fixed_matmul(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Triton launcher; same contract as ``fixed_matmul_ref``."""
    device = check_same_device(x, weight)
    check(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1],
          f"x must be [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    check_model_dtype("x", x)
    check(x.dtype == weight.dtype, f"x is {x.dtype} but the weight is {weight.dtype}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=device)
    if m and n:
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
        kernel_for(_fixed_matmul_kernel, device)[grid](
            x, weight, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
            DOT_DTYPE=dot_dtype(x.dtype, device), DOT_PRECISION=dot_precision(x.dtype), num_warps=4,
        )
    return out
