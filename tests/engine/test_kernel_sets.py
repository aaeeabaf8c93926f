"""The model's forward gives the same hidden states and the same KV cache on every kernel set.

Kernel tests compare each op with its reference; this compares the model wired to each set (native CPU,
references, Triton under the interpreter on CPU hosts): prompts, a mixed step (decodes with a prompt
chunk on a cached prefix) and a decode step, on the first two layers of SmolLM2 (float32). It is what
shows, for instance, that the fused rotary-and-K/V-store op gets the right cache and slots.
"""

from __future__ import annotations

import pytest
import torch

from kernels._triton import interpreter_active
from kernels.dispatch import native_cpu_available
from tests.engine.paged_inputs import Batches, first_layers

pytestmark = pytest.mark.slow

STEPS = [[(0, 37), (1, 5), (2, 16)], [(0, 1), (1, 1), (2, 9)], [(0, 1), (1, 1), (2, 1)]]


def run_steps(model, config, backend: str, kernel_config) -> tuple[list[torch.Tensor], list]:
    kernel_config(backend=backend)
    batches = Batches(config, num_blocks=32, dtype=torch.float32, device="cpu", seed=5)
    batches.new_sequences(3)
    hidden = []
    with torch.inference_mode():
        for chunks in STEPS:
            ids, positions, meta, _ = batches.build(chunks)
            hidden.append(model(ids, positions, meta, batches.caches))
    return hidden, batches.caches


def test_every_kernel_set_gives_the_native_cpu_forward(smollm_fp32, kernel_config):
    model, config = first_layers(smollm_fp32, 2)
    base = "cpu" if native_cpu_available() else "ref"
    backends = ["ref"] * (base != "ref") + ["triton"] * interpreter_active()
    if not backends:
        pytest.skip("only the reference kernel set runs here (no C compiler, no TRITON_INTERPRET): nothing to compare")
    expected, expected_caches = run_steps(model, config, base, kernel_config)
    for backend in backends:
        hidden, caches = run_steps(model, config, backend, kernel_config)
        for step, (got, want) in enumerate(zip(hidden, expected)):
            torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4, msg=lambda m: f"{backend} step {step}: {m}")
        for layer, ((k, v), (k_want, v_want)) in enumerate(zip(caches, expected_caches)):
            torch.testing.assert_close(k, k_want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{backend} K {layer}: {m}")
            torch.testing.assert_close(v, v_want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{backend} V {layer}: {m}")
    assert expected_caches[1][0].abs().sum() > 0  # the caches were written
