"""Every Triton kernel compiles to a cubin for Hopper (sm_90) and Ampere (sm_80),
with no GPU needed: the compiler and ptxas run on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels._triton import HAS_TRITON

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ["_paged_decode_attention_kernel", "_paged_decode_merge_kernel", "_paged_prefill_attention_kernel",
           "_rms_norm_kernel", "_silu_and_mul_kernel", "_rotary_embedding_kernel", "_store_kv_kernel",
           "_rotary_and_store_kv_kernel"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_all_kernels_compile_for_cuda_targets():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.compile_for_cuda", "--arch", "90", "80"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    for kernel in KERNELS:
        for dtype in ("bfloat16", "float32"):
            for arch in (90, 80):
                assert f"OK {kernel} {dtype} sm_{arch}" in proc.stdout, report
