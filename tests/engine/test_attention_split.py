"""A mixed step's attention: its leading one-token sequences (`num_decodes`) through the decode kernel,
the rest through the prefill kernel, gives what the prefill kernel alone gives for every row, on every
kernel set (native CPU, references, Triton under the interpreter on CPU hosts or compiled on CUDA)."""

from __future__ import annotations

import pytest
import torch

from inference.engine.attention import PagedAttention
from kernels._triton import HAS_TRITON, interpreter_active
from kernels.dispatch import _ops
from tests.kernels.paged_cases import make_paged_case

HEADS, DIM = (9, 3), 32


def _backends():
    out = [("cpu", "cpu"), ("ref", "cpu")]
    if HAS_TRITON and interpreter_active():
        out.append(("triton", "cpu"))
    if HAS_TRITON and torch.cuda.is_available() and not interpreter_active():
        out.append(("triton", "cuda"))
    return out


@pytest.mark.parametrize("backend,device", _backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_mixed_step_equals_the_prefill_kernel_alone(backend, device, dtype):
    # four decodes first (one of context 1), then a whole prompt, a chunk on a cached prefix, a later decode
    q_lens, seq_lens = [1, 1, 1, 1, 19, 6, 1], [40, 17, 1, 130, 19, 37, 50]
    case = make_paged_case(q_lens, seq_lens, *HEADS, DIM, 16, dtype, device, seed=21)
    ops = _ops(backend)
    layer = PagedAttention(*HEADS, DIM, case.scale)
    cache = (case.k_cache, case.v_cache)
    whole = layer(case.q, cache, case.attention_metadata(0), ops)
    split = layer(case.q, cache, case.attention_metadata(4), ops)
    tol = 3e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(split.float().cpu(), whole.float().cpu(), atol=tol, rtol=0)
    assert split.shape == (case.q.shape[0], HEADS[0] * DIM)


@pytest.mark.parametrize("backend,device", _backends())
def test_split_takes_q_as_a_strided_view(backend, device):
    """In the model q is a column slice of the fused QKV projection: its rows are not contiguous."""
    q_lens, seq_lens = [1, 1, 9], [33, 5, 9]
    case = make_paged_case(q_lens, seq_lens, *HEADS, DIM, 16, torch.float32, device, seed=22)
    wide = torch.randn(case.q.shape[0], 2 * HEADS[0] * DIM, device=device)
    wide[:, : HEADS[0] * DIM] = case.q.reshape(case.q.shape[0], -1)
    q = wide[:, : HEADS[0] * DIM].view(case.q.shape[0], HEADS[0], DIM)
    assert not q.is_contiguous()
    ops, layer = _ops(backend), PagedAttention(*HEADS, DIM, case.scale)
    cache = (case.k_cache, case.v_cache)
    torch.testing.assert_close(layer(q, cache, case.attention_metadata(2), ops),
                               layer(case.q, cache, case.attention_metadata(0), ops), atol=3e-5, rtol=0)
