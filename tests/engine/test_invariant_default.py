"""Batch-invariant mode's default (EngineConfig.batch_invariant None): on where the default kernels are the
mode's own (a bf16 Q4 model the native stack runs, on a CPU without 16-bit GEMM hardware, with the C GEMMs
that keep PyTorch's int4 and the int8 head's bits at many rows), off elsewhere; an explicit True/False wins,
and the fingerprint says which mode runs."""

from __future__ import annotations

import pytest
import torch

from inference.engine import Engine, EngineConfig, native_stack
from inference.engine.invariant_mode import invariant_default
from inference.engine.loader import load_model
from kernels import int4_gemm_cpu
from kernels.q8_matmul_cpu import library as q8_library

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm_bf16():
    return load_model(MODEL, dtype=torch.bfloat16, device=torch.device("cpu"))


def _kernels_here(model) -> bool:
    lib = q8_library()
    return (int4_gemm_cpu.variant() is not None and lib is not None and lib.q8_matmul_isa() == 1
            and native_stack.eligible(model))


def test_on_for_a_bf16_q4_model_without_16_bit_gemm_and_the_engine_follows(smollm_bf16, cpu_matmul_config):
    cpu_matmul_config(upcast="1")
    if not _kernels_here(smollm_bf16.model):
        pytest.skip("no C int4 GEMM matching this torch, no AVX2 q8 GEMM or no native stack: the default is off")
    expected = True
    assert invariant_default(smollm_bf16.model, torch.device("cpu"), torch.bfloat16) is expected
    auto = Engine(EngineConfig(model=MODEL, dtype="bfloat16", kv_cache_mb=32), loaded=smollm_bf16)
    assert auto.config.batch_invariant is expected
    assert auto.runner.batch_invariant is expected and auto.stats()["batch_invariant"] is expected
    forced = Engine(EngineConfig(model=MODEL, dtype="bfloat16", kv_cache_mb=32, batch_invariant=expected),
                    loaded=smollm_bf16)
    assert auto.system_fingerprint == forced.system_fingerprint
    off = Engine(EngineConfig(model=MODEL, dtype="bfloat16", kv_cache_mb=32, batch_invariant=False),
                 loaded=smollm_bf16)
    assert off.config.batch_invariant is False
    assert off.system_fingerprint != auto.system_fingerprint


def test_off_where_the_default_has_faster_kernels(smollm_bf16, smollm_fp32, cpu_matmul_config):
    cpu_matmul_config(upcast="0")  # as on a CPU with bf16 GEMM: the default takes the dense GEMM for many rows
    assert invariant_default(smollm_bf16.model, torch.device("cpu"), torch.bfloat16) is False
    cpu_matmul_config(upcast="1")
    # float32 models multiply densely (the mode would take the fixed-order matmul)
    assert invariant_default(smollm_fp32.model, torch.device("cpu"), torch.float32) is False
    engine = Engine(EngineConfig(model=MODEL, dtype="float32", kv_cache_mb=32), loaded=smollm_fp32)
    assert engine.config.batch_invariant is False
    # and CUDA keeps its fastest kernels
    assert invariant_default(smollm_bf16.model, torch.device("cuda"), torch.bfloat16) is False
