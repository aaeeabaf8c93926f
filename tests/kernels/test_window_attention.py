"""Sliding-window attention (Gemma 3's local layers, Mistral's `sliding_window`) in every attention kernel: a
token at position p sees keys p - window + 1 .. p. The references against a float64 dense attention with
that mask, and the Triton launchers (interpreter on the CPU, small shapes) and the native CPU paths against
the references; windows from 1 up to longer than every sequence."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_native
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.paged_decode_attention_cpu import paged_decode_attention_cpu
from kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from kernels.row_attention import paged_attention_rows_cpu, paged_attention_rows_ref, paged_attention_rows_triton
from tests.kernels.paged_cases import dense_kv, make_paged_case
from tests.kernels.test_triton_kernels import ATTN_TOL, assert_close

WINDOWS = [1, 5, 16, 23, 200]
# whole prompt, chunk on a cached prefix, decodes, a chunk ending mid-block, a long prompt (BLOCK_M 64)
PREFILL = ([19, 5, 1, 1, 16, 1, 70], [19, 37, 1, 50, 48, 17, 90])
DECODE_LENS = [1, 15, 16, 17, 49, 130]


def windowed_attention(case, window: int) -> torch.Tensor:
    """float64 dense attention, each query over its window of keys."""
    q = case.q.cpu().double()
    group = q.shape[1] // case.k_cache.shape[2]
    out, start = torch.zeros_like(q), 0
    for b, q_len in enumerate(case.q_lens):
        k, v = (t.double() for t in dense_kv(case, b))
        for i in range(q_len):
            pos = k.shape[0] - q_len + i
            lo = max(0, pos - window + 1)
            for h in range(q.shape[1]):
                scores = k[lo:pos + 1, h // group] @ q[start + i, h] * case.scale
                out[start + i, h] = torch.softmax(scores, dim=0) @ v[lo:pos + 1, h // group]
        start += q_len
    return out


def _prefill_args(case):
    return (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc, case.seq_lens,
            case.scale, case.max_query_len, case.max_seq_len)


@pytest.mark.parametrize("window", WINDOWS)
def test_references_against_dense_windowed_attention(window):
    case = make_paged_case(*PREFILL, 6, 2, 16, 16, torch.float32, seed=20)
    expected = windowed_attention(case, window).float()
    assert_close(paged_prefill_attention_ref(*_prefill_args(case), window=window), expected, 1e-5)
    decode = make_paged_case([1] * len(DECODE_LENS), DECODE_LENS, 6, 2, 16, 16, torch.float32, seed=21)
    args = (decode.q, decode.k_cache, decode.v_cache, decode.block_tables, decode.seq_lens, decode.scale)
    assert_close(paged_decode_attention_ref(*args, window=window), windowed_attention(decode, window).float(), 1e-5)
    # the cached decode plan serves windowed and unwindowed layers alike
    assert_close(paged_decode_attention_ref(*args), windowed_attention(decode, 10 ** 6).float(), 1e-5)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("num_splits", [1, 3, None])
def test_triton_decode_window(device, window, num_splits):
    dtype = torch.float32
    case = make_paged_case([1] * len(DECODE_LENS), DECODE_LENS, 6, 2, 32, 16, dtype, device, seed=22)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    out = paged_decode_attention(*args, num_splits=num_splits, window=window)
    assert_close(out, paged_decode_attention_ref(*args, window=window), ATTN_TOL[dtype])


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_prefill_window(device, window, dtype):
    case = make_paged_case(*PREFILL, 8, 2, 32, 16, dtype, device, seed=23)
    args = _prefill_args(case)
    assert_close(paged_prefill_attention(*args, window=window), paged_prefill_attention_ref(*args, window=window),
                 ATTN_TOL[dtype])
    out = paged_prefill_attention(*args, first_seq=3, window=window)  # after a mixed step's leading decodes
    assert_close(out, paged_prefill_attention_ref(*args, first_seq=3, window=window), ATTN_TOL[dtype])


def _rows_case(device):
    """Rows of the batch-invariant mode: each row its own one-token sequence."""
    lens = [1, 4, 9, 17, 40, 3, 33]
    return make_paged_case([1] * len(lens), lens, 6, 2, 32, 8, torch.float32, device, seed=24)


@pytest.mark.parametrize("window", [1, 8, 20])
def test_triton_rows_window(device, window):
    case = _rows_case(device)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    assert_close(paged_attention_rows_triton(*args, window=window), paged_attention_rows_ref(*args, window=window),
                 ATTN_TOL[torch.float32])


@pytest.mark.skipif(not cpu_native.available(), reason="the native CPU kernels did not build")
@pytest.mark.parametrize("window", [1, 8, 20, 100])
def test_native_cpu_decode_and_rows_window(window):
    """The native kernel starts each sequence at its window's first key; rows decide one by one (a row's
    result never depends on the batch)."""
    case = _rows_case("cpu")
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    expected = paged_decode_attention_ref(*args, window=window)
    assert_close(paged_decode_attention_cpu(*args, window=window), expected, 1e-5)
    rows = paged_attention_rows_cpu(*args, window=window)
    assert_close(rows, expected, 1e-5)
    for row in range(case.q.shape[0]):  # alone, the same bits as in the batch
        alone = paged_attention_rows_cpu(case.q[row:row + 1], case.k_cache, case.v_cache,
                                         case.block_tables[row:row + 1], case.seq_lens[row:row + 1], case.scale,
                                         window=window)
        assert torch.equal(alone, rows[row:row + 1])


@pytest.mark.skipif(not cpu_native.available(), reason="the native CPU kernels did not build")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 2, 3, None])
@pytest.mark.parametrize("window", [1, 7, 16, 23, 200])
def test_native_cpu_decode_window_reads_only_its_window(window, num_splits, dtype):
    """Against float64 dense windowed attention, every split count: and the blocks wholly before a sequence's
    window are never read (their table entries made invalid: the kernel neither reads nor rejects them, so the
    block manager may give those blocks back)."""
    case = make_paged_case([1] * len(DECODE_LENS), DECODE_LENS, 8, 2, 64, 16, dtype)
    expected = windowed_attention(case, window).to(dtype)
    tables = case.block_tables.clone()
    block = case.k_cache.shape[1]
    for b, length in enumerate(DECODE_LENS):
        first_read = max(0, length - window) // block
        tables[b, :first_read] = -1
    got = paged_decode_attention_cpu(case.q, case.k_cache, case.v_cache, tables, case.seq_lens, case.scale,
                                     num_splits=num_splits, window=window)
    assert_close(got, expected, ATTN_TOL[dtype])
