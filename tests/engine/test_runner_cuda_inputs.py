"""The model runner's CUDA-side input rules: the mixed-step split threshold (`MIXED_SPLIT_MIN_PAIRS`, the
CPU's rule unchanged), and on a CUDA device the staging buffers (`_Staging`) giving the pageable path's
tensors, step after step, including a ring coming round and a step bigger than any before."""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from inference.engine.model_runner import MIXED_SPLIT_MIN_PAIRS, ModelRunner, _Staging
from tests.engine.test_model_runner import runner, seq


def mixed_step():
    chunk = seq(list(range(100, 110)), [7, 1, 9], 2)  # positions 2..7: no sample
    first = seq(list(range(10, 17)), [5, 2], 6)  # decodes position 6
    tail = seq(list(range(200, 205)), [3, 4], 3)  # positions 3..4: samples
    second = seq([1, 2, 3], [6], 2)  # decodes position 2
    return [chunk, first, tail, second], [6, 1, 2, 1]


def test_few_decodes_stay_with_the_prefill_kernel_on_cuda():
    """Two decodes of a model with 3 KV heads are 6 (sequence, KV head) pairs: below the CUDA threshold the
    step keeps the scheduler's order and sends every row through the prefill kernel (num_decodes 0), as the
    unsplit peer does; at or above it, or with the CPU's rule (no threshold), the decodes go in front."""
    seqs, counts = mixed_step()
    assert ModelRunner.split_min_pairs == 0 and MIXED_SPLIT_MIN_PAIRS == 512
    r = runner()
    r.num_kv_heads, r.split_min_pairs = 3, MIXED_SPLIT_MIN_PAIRS
    ids, _, meta, rows, sampling = r.prepare(seqs, counts)
    assert ids.tolist() == [102, 103, 104, 105, 106, 107, 16, 203, 204, 3]
    assert meta.num_decodes == 0 and rows.tolist() == [6, 8, 9] and sampling == [seqs[1], seqs[2], seqs[3]]
    r.split_min_pairs = 6  # 2 decodes x 3 KV heads reach it
    ids, _, meta, rows, sampling = r.prepare(seqs, counts)
    assert meta.num_decodes == 2 and ids.tolist()[:2] == [16, 3] and sampling == [seqs[1], seqs[3], seqs[2]]
    cpu = runner()  # the class defaults: the CPU's rule
    assert cpu.prepare(seqs, counts)[2].num_decodes == 2


def test_decode_only_steps_ignore_the_threshold():
    a, b = seq([1, 2, 3, 4, 5], [0, 1], 4), seq([6, 7], [2], 1)
    r = runner()
    r.num_kv_heads, r.split_min_pairs = 3, MIXED_SPLIT_MIN_PAIRS
    meta = r.prepare([a, b], [1, 1])[2]
    assert meta.decode_only and meta.num_decodes == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_staging_gives_the_arrays_step_after_step():
    staging = _Staging(torch.device("cuda"), torch.int64, slots=3)
    rng = random.Random(0)
    kept = []
    for n in [5, 7000, 3, 9000, 12, 1, 20000, 4, 4, 4]:  # grows, shrinks, each slot reused three times
        values = array("q", [rng.randrange(-2**40, 2**40) for _ in range(n)])
        out = staging.upload(values)
        assert out.device.type == "cuda" and out.dtype == torch.int64 and out.shape == (n,)
        kept.append((values, out.clone()))  # what a step's kernels read, queued behind the copy
        values[0] += 1  # the host's array may change once uploaded: the copy came from the pinned buffer
    assert all(out.tolist()[1:] == list(values)[1:] and out[0].item() == values[0] - 1 for values, out in kept)
    assert sum(h is not None for h in staging.hosts) == 3 and all(h.is_pinned() for h in staging.hosts)
