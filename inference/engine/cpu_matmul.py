"""Dense matmuls of bfloat16/float16 models on CPUs without 16-bit GEMM hardware.

On CPUs with AVX-512-BF16 or AMX, oneDNN multiplies bfloat16 matrices natively
and faster than float32. Elsewhere (AVX2-only x86, e.g. AMD Zen 1-3) PyTorch
falls back to a generic kernel that runs several times slower than its float32
GEMM on the same shapes. There, inputs of at least
`UPCAST_MIN_ROWS` rows are multiplied in float32: the activations are upcast,
and the weight chunk by chunk (`CHUNK_ROWS` output rows at a time, so the float32
copy stays in cache and the weights stay 16-bit in memory). Each output element
is still a float32 accumulation of exactly representable products, rounded
once to the model's dtype, as the native 16-bit kernels do; only the
summation order differs. Fewer rows (single-stream decode) are bound by
memory bandwidth, where reading 16-bit weights directly is faster.

``configure(upcast=...)`` (a server's ``ENGINE_CPU_UPCAST_MATMUL``): ``auto``
(default: upcast where the CPU lacks the 16-bit GEMM), ``1`` (always upcast on
the CPU), ``0`` (never).

Where the CPU has the bfloat16 GEMM, `F.linear` hands oneDNN a plain row-major
weight, which oneDNN reorders into its blocked (AMX/AVX-512) layout on every
call: for SmolLM2's small matrices that reorder costs about as much as the
product. `prepack` makes that blocked copy once, at load time, and
`prepacked_linear` multiplies by it: bit-identical results, without the
reorder on every call. The copy costs the dense weights' size again in memory;
``configure(prepack=False)`` (``ENGINE_CPU_PREPACK=0``) turns it off.

Both knobs are process-wide, as the matmuls they steer are module functions
called by every model in the process; the defaults are written here only.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

UPCAST_MODES = ("auto", "0", "1")
PREPACK_BATCH_HINT = 64  # oneDNN's layout hint; with 64 the products equal F.linear's bit for bit at 1-1024 rows
UPCAST_MIN_ROWS = 8  # the crossover: fewer rows are bandwidth-bound, where the 16-bit GEMV wins
CHUNK_ROWS = 2048  # 2048 x 576 float32 = 4.7 MB: the weight chunk stays in L2/L3 for the GEMM


_upcast = "auto"
_prepack = True


def configure(*, upcast: str | None = None, prepack: bool | None = None) -> tuple[str, bool]:
    """Set the upcast mode (auto, 0, 1) and whether weights are prepacked; None keeps the current value.
    Returns the previous (upcast, prepack), so a caller can restore them."""
    global _upcast, _prepack
    previous = (_upcast, _prepack)
    if upcast is not None:
        mode = str(upcast).strip().lower()
        if mode not in UPCAST_MODES:
            raise ValueError(f"the CPU upcast mode (ENGINE_CPU_UPCAST_MATMUL) must be auto, 0 or 1; got {upcast!r}")
        _upcast = mode
    if prepack is not None:
        _prepack = bool(prepack)
    return previous


@functools.cache
def _native_16bit_gemm(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies `dtype` natively on this CPU (private torch probes; False if absent)."""
    probe = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, probe)())
    except (AttributeError, RuntimeError):
        return False


def upcast_enabled(dtype: torch.dtype) -> bool:
    """Whether CPU matmuls of `dtype` weights run in float32 (see the module docstring)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return False
    if _upcast == "auto":
        return not _native_16bit_gemm(dtype)
    return _upcast == "1"


def upcast_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear computed in float32 and rounded once to x's dtype; weight upcast CHUNK_ROWS rows at a time."""
    xf = x.float()
    n = weight.shape[0]
    if n <= CHUNK_ROWS:
        out = F.linear(xf, weight.float(), None if bias is None else bias.float())
        return out.to(x.dtype)
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    for start in range(0, n, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, n)
        part = F.linear(xf, weight[start:stop].float(), None if bias is None else bias[start:stop].float())
        out[..., start:stop] = part
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, upcast to float32 on the CPU when that is faster (see the module docstring)."""
    if (x.is_cpu and x.dim() >= 2 and x.numel() >= UPCAST_MIN_ROWS * x.shape[-1]
            and upcast_enabled(weight.dtype)):
        return upcast_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def prepack_enabled(weight: torch.Tensor) -> bool:
    """Whether `weight` gets a oneDNN-blocked copy: bf16 on a CPU with the native bf16 GEMM, not upcast."""
    return (_prepack and weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2
            and not upcast_enabled(weight.dtype) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def prepack(weight: torch.Tensor) -> torch.Tensor | None:
    """A oneDNN-blocked copy of `weight` [N, K] for `prepacked_linear`, or None where it does not apply."""
    if not prepack_enabled(weight):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PREPACK_BATCH_HINT)
    except RuntimeError:  # a oneDNN build without this path: keep F.linear
        return None


def prepacked_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for 2-D bf16 `x`, with `packed = prepack(weight)`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
