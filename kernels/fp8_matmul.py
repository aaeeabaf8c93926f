"""fp8 (E4M3) linear layers with per-output-channel scales, for Hopper-class GPUs.

A weight [N, K] is stored as E4M3 codes and one float32 scale per output row
(``quantize_weight``: the row's largest magnitude maps to 448, E4M3's largest
finite value), half the bytes of bf16. Two products use it:

- ``fp8_weight_only_matmul`` (few rows: decode at small batch, where a linear
  layer is bound by reading its weight): a Triton kernel streams the codes,
  widens them to bf16 in registers, multiplies by the bf16 activations with
  float32 accumulation and applies the column scales once at the end. One
  program per BLOCK_N output columns over the whole K axis (no split-K, so
  one launch and a fixed reduction order); for one row, a GEMV kernel without
  tensor cores is a candidate too. The kernel and tile are picked per (N, K)
  by timing a few candidates on first use (``_pick_config``), never while a
  CUDA graph is being captured.
- ``fp8_w8a8_matmul`` (many rows: prefill, large batches, where the layer is
  bound by arithmetic): the activations are quantised per row
  (``quantize_rows``, one Triton kernel: a float32 scale per row and E4M3
  codes) and ``torch._scaled_mm`` multiplies the two fp8 operands on the fp8
  tensor cores with row-wise scales, out in bf16.

``*_ref`` are the same products in plain PyTorch (dequantise, multiply in
float32), which the tests hold the kernels to.
"""

from __future__ import annotations

import torch

from kernels._triton import check, interpreter_active, jit, kernel_for, tl, triton

FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)
FP8_MAX = 448.0
SCALE_FLOOR = 1e-12  # an all-zero row's scale: its codes are all zero
WEIGHT_ONLY_MAX_ROWS = 16  # one 16-row tile of the weight-only kernel; more rows take the W8A8 product


def fp8_available(device: torch.device | str) -> bool:
    """Whether the fp8 products run on ``device``: CUDA, compute capability 8.9 or later (Ada, Hopper),
    a PyTorch with E4M3 tensors and ``_scaled_mm``, and Triton."""
    from kernels._triton import HAS_TRITON

    device = torch.device(device)
    if device.type != "cuda" or FP8_DTYPE is None or not hasattr(torch, "_scaled_mm") or not HAS_TRITON:
        return False
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (E4M3 codes [N, K], float32 scales [N]); weight ~= codes * scales[:, None]."""
    check(weight.dim() == 2, f"weight must be [N, K], got {tuple(weight.shape)}")
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp_min(SCALE_FLOOR) / FP8_MAX
    codes = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes.contiguous(), scale.contiguous()


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 codes * scale, one scale per row of ``codes``."""
    return codes.float() * scale.reshape(-1, 1)


def quantize_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (E4M3 codes [M, K], float32 scales [M, 1]), one scale per row."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp_min(SCALE_FLOOR) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_weight_only_ref(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (codes * scale).T in float32, rounded once to x's dtype."""
    return (x.float() @ dequantize(codes, scale).t()).to(x.dtype)


def fp8_w8a8_ref(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The W8A8 product: x quantised per row, both operands dequantised, multiplied in float32."""
    xq, xs = quantize_rows_ref(x)
    return ((xq.float() * xs) @ dequantize(codes, scale).t()).to(x.dtype)


# ---------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------

@jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / 448.0
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        tl.store(q_ptr + row * stride_qm + k0 + offs, q.to(q_ptr.dtype.element_ty), mask=k0 + offs < K)
    tl.store(s_ptr + row, scale)


@jit
def _fp8_weight_only_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * stride_wn + kk[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc += tl.dot(x.to(DOT_DTYPE), w.to(DOT_DTYPE))
    scale = tl.load(s_ptr + cols, mask=col_ok, other=0.0)
    out = acc * scale[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One row of x (batch-1 decode): no tensor cores, products summed in float32 across the K axis at the end.
    pid = tl.program_id(0).to(tl.int64)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    col_ok = cols < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        x = tl.load(x_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols[:, None] * stride_wn + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    out = tl.sum(acc, axis=1) * tl.load(s_ptr + cols, mask=col_ok, other=0.0)
    tl.store(out_ptr + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


# ("dot" | "gemv", BLOCK_N, BLOCK_K, num_warps, num_stages). The tensor-core kernel takes up to 16 rows in
# one tile; the GEMV kernel one row. Narrow column blocks give small N enough programs to cover the SMs;
# each program streams BLOCK_N rows of codes down the whole K axis.
_CONFIGS = (("dot", 16, 512, 4, 4), ("dot", 32, 256, 4, 4), ("dot", 64, 256, 4, 3), ("dot", 32, 512, 8, 3))
_GEMV_CONFIGS = (("gemv", 8, 512, 4, 3), ("gemv", 4, 1024, 4, 3), ("gemv", 16, 256, 4, 3), ("gemv", 16, 512, 8, 3),
                 ("gemv", 32, 256, 8, 3), ("gemv", 2, 2048, 4, 3))
_DEFAULT_CONFIG = _CONFIGS[0]
_picked: dict[tuple, tuple] = {}


def _launch_weight_only(x, codes, scale, out, config) -> None:
    kind, block_n, block_k, warps, stages = config
    (m, k), n = x.shape, codes.shape[0]
    kwargs = {} if x.device.type == "cpu" else {"num_warps": warps, "num_stages": stages}
    grid = (triton.cdiv(n, block_n),)
    if kind == "gemv":
        kernel_for(_fp8_gemv_kernel, x.device)[grid](x, codes, scale, out, n, k, codes.stride(0),
                                                     BLOCK_N=block_n, BLOCK_K=block_k, **kwargs)
        return
    dot_dtype = tl.float32 if x.device.type == "cpu" else tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16
    kernel_for(_fp8_weight_only_kernel, x.device)[grid](
        x, codes, scale, out, m, n, k, x.stride(0), codes.stride(0), out.stride(0),
        BLOCK_M=WEIGHT_ONLY_MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k, DOT_DTYPE=dot_dtype, **kwargs,
    )


def _pick_config(x, codes, scale, out) -> tuple:
    """The fastest launch for this (N, K, dtype, one row or more), timed once on first use (one row also
    tries the GEMV kernel); the default tile under the interpreter or while a graph is being captured
    (warm-ups run before captures, so that is rare)."""
    one = x.shape[0] == 1
    key = (codes.shape[0], codes.shape[1], x.dtype, x.device, one)
    config = _picked.get(key)
    if config is not None:
        return config
    if x.device.type != "cuda" or interpreter_active() or torch.cuda.is_current_stream_capturing():
        return _DEFAULT_CONFIG
    from triton.testing import do_bench

    times = {}
    for candidate in _CONFIGS + (_GEMV_CONFIGS if one else ()):
        try:
            times[candidate] = do_bench(lambda: _launch_weight_only(x, codes, scale, out, candidate),
                                        warmup=5, rep=20, return_mode="median")
        except Exception:  # noqa: BLE001 - a tile that does not fit this GPU (shared memory): not a candidate
            continue
    config = min(times, key=times.get) if times else _DEFAULT_CONFIG
    _picked[key] = config
    return config


def fp8_weight_only_matmul(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M <= 16, K] (bf16/fp16) @ (codes * scale).T -> [M, N] in x's dtype; same contract as
    ``fp8_weight_only_ref``."""
    check(x.dim() == 2 and codes.dim() == 2 and x.shape[1] == codes.shape[1],
          f"x must be [M, K] and codes [N, K], got {tuple(x.shape)} and {tuple(codes.shape)}")
    check(x.shape[0] <= WEIGHT_ONLY_MAX_ROWS, f"at most {WEIGHT_ONLY_MAX_ROWS} rows, got {x.shape[0]}")
    check(codes.dtype == FP8_DTYPE and scale.dtype == torch.float32 and scale.numel() == codes.shape[0],
          "codes must be float8_e4m3fn [N, K] with float32 scales [N]")
    check(x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"x must be a float tensor, got {x.dtype}")
    if x.stride(1) != 1:
        x = x.contiguous()
    check(codes.stride(1) == 1, "codes rows must be contiguous")
    out = torch.empty((x.shape[0], codes.shape[0]), dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _launch_weight_only(x, codes, scale, out, _pick_config(x, codes, scale, out))
    return out


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher; same contract as ``quantize_rows_ref``."""
    check(x.dim() == 2, f"x must be [M, K], got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    codes = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block_k = min(1024, max(16, triton.next_power_of_2(k)))
        kwargs = {} if x.device.type == "cpu" else {"num_warps": 4}
        kernel_for(_quantize_rows_kernel, x.device)[(m,)](x, codes, scale, k, x.stride(0), codes.stride(0),
                                                         BLOCK_K=block_k, **kwargs)
    return codes, scale


def w8a8_shape_ok(n: int, k: int) -> bool:
    """Whether ``torch._scaled_mm`` takes a weight [N, K]: both dimensions multiples of 16."""
    return n % 16 == 0 and k % 16 == 0


def fp8_w8a8_matmul(x: torch.Tensor, codes_t: torch.Tensor, scale_row: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 @ weight.T with the weight given as ``codes_t`` = codes.t() ([K, N], column-major, as
    ``_scaled_mm`` takes it) and ``scale_row`` = scales as [1, N]; -> [M, N] bf16. CUDA only."""
    xq, xs = quantize_rows(x)
    return torch._scaled_mm(xq, codes_t, scale_a=xs, scale_b=scale_row, out_dtype=x.dtype)
