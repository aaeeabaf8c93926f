"""Compile every Triton kernel for a CUDA target without a GPU (ptxas ships in
the triton wheel): proves the kernels type-check, lower and assemble for real
hardware, which the CPU interpreter cannot. Run by test_cuda_compile.py in a
subprocess, because TRITON_INTERPRET must be off before triton is imported.

    python -m tests.kernels.compile_for_cuda --arch 90 80
"""

from __future__ import annotations

import argparse
import os
import sys

import torch


class _Recorder:
    """Stands in for a kernel launch: records the arguments, runs nothing."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.kernel, args, kwargs))


def _record_launches(dtype: torch.dtype) -> list:
    from kernels import activation, kv_store, rms_norm, rotary, rotary_kv_store
    from kernels import paged_decode_attention as pda
    from kernels import prefill_attention as pfa
    from tests.kernels.paged_cases import make_paged_case

    calls: list = []
    modules = (activation, kv_store, pda, pfa, rms_norm, rotary, rotary_kv_store)
    saved = [m.kernel_for for m in modules]
    for m in modules:
        m.kernel_for = lambda kernel, device: _Recorder(kernel, calls)
    try:
        case = make_paged_case([1, 1], [5, 300], 9, 3, 64, 16, dtype)
        args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.125)
        pda.paged_decode_attention(*args, num_splits=1)
        pda.paged_decode_attention(*args, num_splits=4)
        case = make_paged_case([7, 1], [40, 9], 9, 3, 64, 16, dtype)
        pfa.paged_prefill_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                    case.query_start_loc, case.seq_lens, 0.125, 7, 40)
        x, w = torch.randn(3, 576).to(dtype), torch.ones(576).to(dtype)
        rms_norm.rms_norm(x, w, 1e-5)
        rms_norm.fused_add_rms_norm(x, x, w, 1e-5)
        activation.silu_and_mul(torch.randn(3, 3072).to(dtype))
        qkv = torch.randn(3, 960).to(dtype)
        q, k, v = qkv[:, :576].view(3, 9, 64), qkv[:, 576:768].view(3, 3, 64), qkv[:, 768:].view(3, 3, 64)
        rotary.rotary_embedding(torch.arange(3), q, k, rotary.build_cos_sin_cache(64, 16, 1e4))
        kv_store.store_kv(k, v, case.k_cache, case.v_cache, torch.arange(3))
        rotary_kv_store.rotary_and_store_kv(torch.arange(3), q, k, v, rotary.build_cos_sin_cache(64, 16, 1e4),
                                            case.k_cache, case.v_cache, torch.arange(3))
    finally:
        for m, fn in zip(modules, saved):
            m.kernel_for = fn
    return calls


_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
          torch.int32: "i32", torch.int64: "i64"}


def _signature(kernel, args, kwargs):
    sig, consts, opts = {}, {}, {}
    for name, val in zip(kernel.arg_names, args):
        if isinstance(val, torch.Tensor):
            sig[name] = "*" + _TYPES[val.dtype]
        elif isinstance(val, bool):
            sig[name] = "i1"
        elif isinstance(val, int):
            sig[name] = "i32" if -(2**31) <= val < 2**31 else "i64"
        elif isinstance(val, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{kernel.fn.__name__}: cannot type argument {name}={val!r}")
    for name, val in kwargs.items():
        if name in ("num_warps", "num_stages"):
            opts[name] = val
        else:
            sig[name], consts[name] = "constexpr", val
    return sig, consts, opts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", type=int, nargs="+", default=[90])
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1 is set; unset it to compile for CUDA", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = 0
    for dtype in (torch.bfloat16, torch.float32):
        for kernel, call_args, kwargs in _record_launches(dtype):
            sig, consts, opts = _signature(kernel, call_args, kwargs)
            for arch in args.arch:
                name = f"{kernel.fn.__name__} {str(dtype).removeprefix('torch.')} sm_{arch}"
                try:
                    compiled = triton.compile(ASTSource(kernel, sig, consts), target=GPUTarget("cuda", arch, 32),
                                              options=opts)
                    print(f"OK {name} shared={compiled.metadata.shared}")
                except Exception as exc:  # report every kernel, then fail
                    failures += 1
                    print(f"FAIL {name}: {type(exc).__name__}: {exc}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
