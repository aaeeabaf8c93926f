"""Triton import guard and launch helpers shared by the kernel modules.

The references must import on machines without Triton, so kernel modules take
``triton``, ``tl`` and ``jit`` from here. ``kernel_for`` checks that a kernel
can run on the tensors' device before launching it.
"""

from __future__ import annotations

import torch

from kernels._utils import SUPPORTED_DTYPES, check  # noqa: F401 - check is re-exported to the launchers

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
    jit = triton.jit
except Exception:  # ImportError, or a broken install raising at import time
    triton = None
    tl = None
    HAS_TRITON = False

    def jit(fn=None, **_options):  # @jit and @jit(do_not_specialize=...) alike
        return _Unavailable(fn) if fn is not None else _Unavailable


class _Unavailable:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        raise RuntimeError("Triton is not installed; use the *_ref implementations")


def kernel_for(kernel, device: torch.device):
    """``kernel``, after checking it can run on ``device``.

    CUDA tensors need a compiled kernel; CPU tensors need Triton's interpreter,
    which is chosen when triton is imported (TRITON_INTERPRET=1 set before the
    first ``import triton``; tests/conftest.py does that on GPU-less hosts).
    """
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use the *_ref implementations")
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    if device.type == "cpu" and not interpreted:
        raise RuntimeError(
            "Triton kernels on CPU tensors need TRITON_INTERPRET=1 in the environment "
            "before triton is first imported"
        )
    if device.type == "cuda" and interpreted:
        raise RuntimeError("TRITON_INTERPRET=1 is set; unset it to run Triton kernels on CUDA")
    return kernel


def interpreter_active() -> bool:
    """Whether kernels (and triton's own library functions) were built for the interpreter."""
    return HAS_TRITON and type(tl.sum).__name__ == "InterpretedFunction"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """Full-precision dot products for float32 models (no TF32)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def dot_dtype(dtype: torch.dtype, device: torch.device):
    """Operand type for ``tl.dot``: the model dtype on the GPU; float32 under the
    interpreter, whose ``dot`` multiplies the raw bits of bfloat16 operands
    (triton 3.9). Products of bf16 values are exact in float32, so only the
    accumulation order differs from the GPU."""
    if device.type == "cpu" or dtype == torch.float32:
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def check_same_device(*tensors: torch.Tensor) -> torch.device:
    device = tensors[0].device
    for t in tensors[1:]:
        check(t.device == device, f"tensors on different devices: {device} and {t.device}")
    return device


def check_model_dtype(name: str, t: torch.Tensor) -> None:
    check(t.dtype in SUPPORTED_DTYPES, f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
