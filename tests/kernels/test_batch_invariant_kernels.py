"""The batch-invariant mode's kernels (inference.engine.invariant_mode): the fixed-order matmul and
attention one row at a time give a row the same bits whatever else shares the call, and the right
values (against the references)."""

from __future__ import annotations

import pytest
import torch

from kernels.fixed_matmul import fixed_matmul, fixed_matmul_ref, fixed_matmul_rows
from kernels.fixed_matmul_cpu import fixed_matmul_cpu, library
from kernels.row_attention import paged_attention_rows_cpu, paged_attention_rows_ref, paged_attention_rows_triton
from tests.kernels.paged_cases import make_paged_case, naive_attention

native = pytest.mark.skipif(library() is None, reason="no C compiler: the native CPU kernels cannot be built")
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def assert_rows_invariant(matmul, x, w, counts, **kwargs):
    """Each prefix of x, each single row and a shuffled x give the rows of the whole product, bit for bit."""
    full = matmul(x, w, **kwargs)
    for m in counts:
        assert torch.equal(matmul(x[:m], w, **kwargs), full[:m]), f"{m} rows"
    for i in (0, 3, x.shape[0] - 1):
        assert torch.equal(matmul(x[i:i + 1], w, **kwargs)[0], full[i]), f"row {i} alone"
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))
    assert torch.equal(matmul(x[perm], w, **kwargs), full[perm])
    return full


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(96, 576), (70, 100), (33, 1536)])
def test_fixed_matmul_cpu_is_row_invariant_and_right(dtype, n, k):
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(41, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    full = assert_rows_invariant(fixed_matmul_cpu, x, w, (1, 2, 7, 8, 9, 16, 17, 40))
    torch.testing.assert_close(full.float(), fixed_matmul_ref(x, w).float(), atol=TOL[dtype], rtol=TOL[dtype])
    logits = assert_rows_invariant(fixed_matmul_cpu, x, w, (1, 9), out_dtype=torch.float32)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, x.float() @ w.float().t(), atol=1e-4, rtol=1e-4)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(fixed_matmul_cpu(x, w), full)  # nor on the thread count
    finally:
        torch.set_num_threads(threads)


@native
@pytest.mark.parametrize("expected,extra", [("avx2", "-mno-avx512f"), ("portable", "-mno-avx512f -mno-avx2 -mno-fma")],
                         ids=["avx2", "portable"])
def test_narrower_builds_are_row_invariant_too(fresh_loader, kernel_config, expected, extra):
    """The AVX2 and portable loops, built here by turning the wider instruction sets off (a host runs only the
    widest its CPU has: without this, an AVX-512 host never exercises the others)."""
    from kernels import cpu_native
    from kernels.fixed_matmul_cpu import isa

    flags = set(cpu_native._cpu_flags().split())
    if expected == "avx2" and not {"avx2", "fma"} <= flags:
        pytest.skip("no AVX2 + FMA on this CPU: the default build already runs the portable loops")
    if expected == "portable" and not {"avx2", "avx512f"} & flags:
        pytest.skip("the default build already runs the portable loops")
    kernel_config(cc=f"{cpu_native.find_compiler()} {extra}")
    assert isa() == expected
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(19, 100, generator=gen).to(dtype)
        w = (torch.randn(70, 100, generator=gen) / 10).to(dtype)
        full = assert_rows_invariant(fixed_matmul_cpu, x, w, (1, 8, 9, 17))
        torch.testing.assert_close(full.float(), fixed_matmul_ref(x, w).float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_fixed_matmul_rows_reference_is_row_invariant():
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(12, 64, generator=gen), torch.randn(40, 64, generator=gen)
    full = assert_rows_invariant(fixed_matmul_rows, x, w, (1, 5, 11))
    torch.testing.assert_close(full, fixed_matmul_ref(x, w))


def numpy_matmul_is_row_invariant() -> bool:
    """Whether numpy's matmul gives a row the same bits wherever it sits in the matrix. Triton's interpreter
    computes `tl.dot` with numpy, so where it does not (OpenBLAS's AVX-512 kernels, seen on a Zen 5 host:
    a row's accumulation order depends on its place in the micro-kernel's tile), the interpreter cannot show
    the compiled kernel's bit-exactness; the compiled kernel on a GPU is checked bit for bit at real shapes."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((70, 80), dtype=np.float32), rng.standard_normal((80, 96), dtype=np.float32)
    order = rng.permutation(70)
    return bool(np.array_equal((a @ b)[order], a[order] @ b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fixed_matmul_triton(device, dtype):
    gen = torch.Generator().manual_seed(5)
    rows, n, k = (70, 90, 80) if device == "cpu" else (300, 960, 576)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    if device == "cpu" and not numpy_matmul_is_row_invariant():
        full = fixed_matmul(x, w)  # the values only: see numpy_matmul_is_row_invariant
    else:
        full = assert_rows_invariant(fixed_matmul, x, w, (1, 3, 64, 65))
    torch.testing.assert_close(full.float(), fixed_matmul_ref(x, w).float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert fixed_matmul(x, w, torch.float32).dtype == torch.float32


def row_inputs(case, rows: list[tuple[int, int]]):
    """(q rows, row block tables, row seq lens) for (sequence, position) pairs of `case`."""
    starts = case.query_start_loc.tolist()
    index = [starts[b] + pos - (int(case.seq_lens[b]) - case.q_lens[b]) for b, pos in rows]
    device = case.q.device
    q = case.q[torch.tensor(index, device=device)]
    tables = case.block_tables[torch.tensor([b for b, _ in rows], device=device)]
    lens = torch.tensor([pos + 1 for _, pos in rows], dtype=torch.int32, device=device)
    return q, tables, lens


ROW_KERNELS = {"ref": paged_attention_rows_ref, "cpu": paged_attention_rows_cpu}


def check_row_attention(attend, case, tol):
    whole = [(b, pos) for b, (q_len, n) in enumerate(zip(case.q_lens, case.seq_lens.tolist()))
             for pos in range(n - q_len, n)]
    q, tables, lens = row_inputs(case, whole)
    out = attend(q, case.k_cache, case.v_cache, tables, lens, case.scale)
    torch.testing.assert_close(out.double().cpu(), naive_attention(case), atol=tol, rtol=tol)
    # sequence 0's rows alone, in chunks of 3 (as chunked prefill meets them), and one by one (decodes)
    mine = [i for i, (b, _) in enumerate(whole) if b == 0]
    for size in (len(mine), 3, 1):
        for at in range(0, len(mine), size):
            part = [whole[i] for i in mine[at:at + size]]
            q_part, tables_part, lens_part = row_inputs(case, part)
            got = attend(q_part, case.k_cache, case.v_cache, tables_part, lens_part, case.scale)
            assert torch.equal(got, out[mine[at]:mine[at] + len(part)]), (size, at)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_attention_cpu_is_row_invariant_and_right(backend, dtype):
    if backend == "cpu" and library() is None:
        pytest.skip("no C compiler: the native CPU kernels cannot be built")
    # a prompt of 40 (8 of them cached before), a decode at 300 and a 5-token chunk of a 70-token sequence
    case = make_paged_case([32, 1, 5], [40, 300, 70], 9, 3, 32, 16, dtype, seed=4)
    check_row_attention(ROW_KERNELS[backend], case, {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_attention_triton(device, dtype):
    lens = [20, 33, 17] if device == "cpu" else [700, 1500, 90]
    case = make_paged_case([12, 1, 5], lens, 6, 2, 32 if device == "cpu" else 64, 16, dtype, device, seed=6)
    check_row_attention(paged_attention_rows_triton, case, {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_attention_cpu_parts_follow_each_rows_own_length(dtype):
    """The native rows are cut into parts of ROW_SPLIT_TILES tiles from their first key: a long row takes
    several parts (threads share it) and still gives the same bits alone, beside shorter or longer rows (which
    change how many parts the call has), on any thread count; and it stays the attention it should be."""
    if library() is None:
        pytest.skip("no C compiler: the native CPU kernels cannot be built")
    from kernels.row_attention import ROW_SPLIT_TILES

    assert ROW_SPLIT_TILES * 32 == 128
    case = make_paged_case([600, 1, 1], [600, 300, 40], 9, 3, 32, 16, dtype, seed=9)
    # positions on both sides of the 128-key part boundaries, and the other sequences' last rows
    rows = [(0, p) for p in (0, 127, 128, 129, 255, 256, 383, 599)] + [(1, 299), (2, 39)]
    q, tables, lens = row_inputs(case, rows)
    together = paged_attention_rows_cpu(q, case.k_cache, case.v_cache, tables, lens, case.scale)
    reference = paged_attention_rows_ref(q, case.k_cache, case.v_cache, tables, lens, case.scale)
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(together.float(), reference.float(), atol=tol, rtol=tol)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for i in range(len(rows)):
                alone = paged_attention_rows_cpu(q[i:i + 1], case.k_cache, case.v_cache, tables[i:i + 1],
                                                 lens[i:i + 1], case.scale)
                assert torch.equal(alone, together[i:i + 1]), (t, rows[i])
            # without the 600-token rows the call has fewer parts; the others keep their bits
            short = [i for i, (b, p) in enumerate(rows) if p < 300]
            pick = torch.tensor(short)
            got = paged_attention_rows_cpu(q[pick], case.k_cache, case.v_cache, tables[pick], lens[pick],
                                           case.scale)
            assert torch.equal(got, together[pick]), t
    finally:
        torch.set_num_threads(threads)
