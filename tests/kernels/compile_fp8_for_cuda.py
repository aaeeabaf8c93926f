"""Compile the fp8 kernels (kernels/fp8_matmul.py) for sm_90 without a GPU, as compile_for_cuda.py does for
the others (E4M3 needs compute capability 8.9+, so no sm_80 here). Run by test_fp8_matmul.py in a subprocess,
because TRITON_INTERPRET must be off before triton is imported.

    python -m tests.kernels.compile_fp8_for_cuda
"""

from __future__ import annotations

import os
import sys

import torch

from tests.kernels import compile_for_cuda as base


def _record() -> list:
    from kernels import fp8_matmul

    calls: list = []
    saved = fp8_matmul.kernel_for
    fp8_matmul.kernel_for = lambda kernel, device: base._Recorder(kernel, calls)
    try:
        codes = torch.zeros(960, 576, dtype=fp8_matmul.FP8_DTYPE)
        scale = torch.ones(960)
        x = torch.zeros(3, 576, dtype=torch.bfloat16)
        out = torch.empty(3, 960, dtype=torch.bfloat16)
        fp8_matmul._launch_weight_only(x.to("meta"), codes, scale, out, fp8_matmul._CONFIGS[0])
        fp8_matmul._launch_weight_only(x[:1].to("meta"), codes, scale, out[:1], fp8_matmul._GEMV_CONFIGS[0])
        fp8_matmul.quantize_rows(torch.zeros(300, 576, dtype=torch.bfloat16))
    finally:
        fp8_matmul.kernel_for = saved
    return calls


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1 is set; unset it to compile for CUDA", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    base._TYPES[torch.float8_e4m3fn] = "fp8e4nv"
    failures = 0
    for kernel, call_args, kwargs in _record():
        sig, consts, opts = base._signature(kernel, call_args, kwargs)
        name = f"{kernel.fn.__name__} sm_90"
        try:
            compiled = triton.compile(ASTSource(kernel, sig, consts), target=GPUTarget("cuda", 90, 32), options=opts)
            print(f"OK {name} shared={compiled.metadata.shared}")
        except Exception as exc:  # report every kernel, then fail
            failures += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
