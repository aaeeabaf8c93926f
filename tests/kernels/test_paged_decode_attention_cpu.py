"""The native CPU decode attention against the reference and a float64 oracle."""

from __future__ import annotations

import logging

import pytest
import torch

from kernels import cpu_native
from kernels.dispatch import get_ops, select_backend
from kernels.paged_decode_attention import paged_decode_attention_ref
from kernels.paged_decode_attention_cpu import paged_decode_attention_cpu
from tests.kernels.paged_cases import make_paged_case, naive_attention

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
DTYPES = list(TOL)

# (Hq, Hkv, head_dim, block_size): GQA groups 3, 1, 4, 8; head_dim 64, 128, 80, 40
SHAPES = [(9, 3, 64, 16), (4, 4, 128, 16), (12, 3, 80, 32), (16, 2, 40, 5)]


@pytest.fixture(scope="module", autouse=True)
def native_library():
    if cpu_native.find_compiler() is None:
        pytest.skip("no C compiler on this host (set CC or install gcc): the native kernel cannot be built")
    if not cpu_native.enabled():
        pytest.skip("the native CPU kernels are configured off (kernels.config cpu_native)")
    assert cpu_native.load() is not None, "a C compiler is present but the native kernel did not build"


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _args(case):
    return case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale


def _check(case, out, dtype):
    tol = TOL[dtype]
    assert out.shape == case.q.shape and out.dtype == dtype
    expected = naive_attention(case)
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
    ref = paged_decode_attention_ref(*_args(case)).double()
    torch.testing.assert_close(out.double(), ref, atol=2 * tol, rtol=2 * tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "Hq%d-Hkv%d-D%d-bs%d" % s)
def test_matches_reference(shape, dtype, threads):
    hq, hkv, dim, bs = shape
    lens = [1, bs, bs + 1, 2 * bs - 1, 300]
    case = make_paged_case([1] * len(lens), lens, hq, hkv, dim, bs, dtype, seed=hq + dim + bs)
    _check(case, paged_decode_attention_cpu(*_args(case)), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_65_mixed_lengths(dtype, threads):
    gen = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 200, (65,), generator=gen).tolist()
    case = make_paged_case([1] * 65, lens, 9, 3, 64, 16, dtype, seed=7)
    _check(case, paged_decode_attention_cpu(*_args(case)), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_splits", [2, 3, 7])
def test_split_kv_merge(dtype, num_splits, threads):
    # short sequences next to long ones: some splits of the short ones are empty
    lens = [1, 17, 33, 450, 1000]
    case = make_paged_case([1] * len(lens), lens, 8, 2, 64, 16, dtype, seed=num_splits)
    _check(case, paged_decode_attention_cpu(*_args(case), num_splits=num_splits), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_batch_1_long_context_splits_on_its_own(dtype):
    # batch 1 with 2 threads takes the automatic split-KV path
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        case = make_paged_case([1], [1500], 9, 3, 64, 16, dtype, seed=11)
        _check(case, paged_decode_attention_cpu(*_args(case)), dtype)
    finally:
        torch.set_num_threads(before)


def test_strided_inputs():
    case = make_paged_case([1] * 4, [5, 16, 17, 90], 6, 3, 64, 16, torch.float32, seed=2)
    expected = naive_attention(case)
    # q as a view of a wider projection output (row stride > Hq * D)
    wide = torch.randn(4, 10, 64)
    wide[:, 2:8] = case.q
    q = wide[:, 2:8]
    assert not q.is_contiguous()
    # block tables as a column slice of a wider table, and in column-major storage
    table = torch.full((4, case.block_tables.shape[1] + 3), -1, dtype=torch.int32)
    table[:, 1:-2] = case.block_tables
    sliced = table[:, 1:-2]
    column_major = case.block_tables.t().contiguous().t()
    lens = torch.stack([case.seq_lens, case.seq_lens], 1)[:, 0]  # strided seq_lens
    for tables in (sliced, column_major):
        out = paged_decode_attention_cpu(q, case.k_cache, case.v_cache, tables, lens, case.scale)
        torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


def test_empty_batch_and_zero_length():
    case = make_paged_case([1, 1], [20, 3], 4, 2, 64, 16, torch.float32)
    empty = paged_decode_attention_cpu(case.q[:0], case.k_cache, case.v_cache, case.block_tables[:0],
                                       case.seq_lens[:0], case.scale)
    assert empty.shape == (0, 4, 64)
    lens = torch.tensor([20, 0], dtype=torch.int32)
    out = paged_decode_attention_cpu(case.q, case.k_cache, case.v_cache, case.block_tables, lens, case.scale)
    assert torch.equal(out[1], torch.zeros(4, 64))


def test_bad_inputs_raise():
    case = make_paged_case([1, 1], [20, 3], 4, 2, 64, 16, torch.float32)
    q, k, v, bt, lens, scale = _args(case)
    bad = [
        ((q[0], k, v, bt, lens, scale), "q must be"),
        ((q.double(), k, v, bt, lens, scale), "float32, bfloat16 or float16"),
        ((q.bfloat16(), k, v, bt, lens, scale), "cache is"),
        ((q[:, :, :32], k, v, bt, lens, scale), "head_dim"),
        ((q[:, :3], k, v, bt, lens, scale), "multiple"),
        ((q, k, v, bt.long(), lens, scale), "block_tables"),
        ((q, k, v, bt[:1], lens, scale), "block_tables"),
        ((q, k, v, bt, lens.long(), scale), "seq_lens"),
        ((q, k, v[:-1], bt, lens, scale), "k_cache/v_cache"),
        ((q, k, v, bt, torch.tensor([20, bt.shape[1] * 16 + 1], dtype=torch.int32), scale), "seq_lens must lie"),
        ((q, k, v, bt, torch.tensor([20, -1], dtype=torch.int32), scale), "seq_lens must lie"),
    ]
    for args, match in bad:
        with pytest.raises(ValueError, match=match):
            paged_decode_attention_cpu(*args)
    out_of_range = bt.clone()
    out_of_range[1, 0] = k.shape[0]
    with pytest.raises(ValueError, match="block id"):
        paged_decode_attention_cpu(q, k, v, out_of_range, lens, scale)
    negative = bt.clone()
    negative[0, 1] = -1
    with pytest.raises(ValueError, match="block id"):
        paged_decode_attention_cpu(q, k, v, negative, lens, scale)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_attention_cpu(*_args(case), num_splits=0)


def test_library_builds_into_the_cache_dir(fresh_loader):
    lib = cpu_native.load()
    assert lib is not None
    built = list(fresh_loader.glob("*.so"))
    assert len(built) == 1 and built[0].name.startswith("paged_decode_attention-")
    assert not list(fresh_loader.glob("*.tmp"))  # the temp file was renamed into place
    # a second process (a new loader) reuses the file instead of building again
    cpu_native._loaded.clear()
    mtime = built[0].stat().st_mtime_ns
    assert cpu_native.load() is not None
    assert built[0].stat().st_mtime_ns == mtime


def _x86_avx2() -> bool:
    flags = cpu_native._cpu_flags().split()
    return "avx2" in flags and "fma" in flags


def test_avx2_cpus_get_the_intrinsics_loops():
    if not _x86_avx2():
        pytest.skip("not an x86 CPU with AVX2 and FMA: the portable loops are the ones tested above")
    assert cpu_native.load().paged_decode_attention_uses_avx2() == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_portable_loops_match_the_reference(fresh_loader, kernel_config, dtype):
    """The loops of CPUs without AVX2 (ARM, older x86), built here with AVX2 and FMA turned off."""
    if not _x86_avx2():
        pytest.skip("not an x86 CPU with AVX2 and FMA: the default build already runs the portable loops")
    kernel_config(cc=f"{cpu_native.find_compiler()} -mno-avx2 -mno-fma")
    lib = cpu_native.load()
    assert lib is not None and lib.paged_decode_attention_uses_avx2() == 0
    for hq, hkv, dim, bs in SHAPES:
        lens = [1, bs, bs + 1, 2 * bs - 1, 300]
        case = make_paged_case([1] * len(lens), lens, hq, hkv, dim, bs, dtype, seed=hq + dim + bs)
        _check(case, paged_decode_attention_cpu(*_args(case)), dtype)
    case = make_paged_case([1] * 5, [1, 17, 33, 450, 1000], 8, 2, 64, 16, dtype, seed=3)
    _check(case, paged_decode_attention_cpu(*_args(case), num_splits=3), dtype)


def test_disabled_falls_back_to_reference(fresh_loader, kernel_config):
    kernel_config(cpu_native=False, backend="auto")
    assert cpu_native.load() is None
    assert select_backend("cpu") == "ref"
    assert get_ops("cpu").paged_decode_attention is paged_decode_attention_ref
    case = make_paged_case([1, 1], [20, 3], 4, 2, 64, 16, torch.float32)
    out = paged_decode_attention_cpu(*_args(case))
    assert torch.equal(out, paged_decode_attention_ref(*_args(case)))
    assert not list(fresh_loader.glob("*.so"))


def test_missing_compiler_warns_once_and_falls_back(fresh_loader, kernel_config, caplog):
    kernel_config(cc="/nonexistent/cc")
    with caplog.at_level(logging.WARNING, logger="kernels.cpu_native"):
        assert cpu_native.load() is None
        cpu_native._loaded.clear()
        assert cpu_native.load() is None
    warnings = [r for r in caplog.records if "native CPU kernels unavailable" in r.getMessage()]
    assert len(warnings) == 1


def test_failed_build_falls_back(fresh_loader, monkeypatch, tmp_path_factory):
    broken = tmp_path_factory.mktemp("src") / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(cpu_native, "SOURCE", broken)
    assert cpu_native.load() is None
    assert not list(fresh_loader.iterdir())  # no library, no leftover temp file


def test_dispatch_uses_native_decode_on_cpu(kernel_config):
    kernel_config(backend="auto")
    assert select_backend("cpu") == "cpu"
    ops = get_ops("cpu")
    assert ops.backend == "cpu"
    assert ops.paged_decode_attention is paged_decode_attention_cpu
    assert ops.paged_prefill_attention is get_ops_ref().paged_prefill_attention
    kernel_config(backend="ref")
    assert get_ops("cpu").paged_decode_attention is paged_decode_attention_ref
    kernel_config(backend="cpu")
    assert select_backend("cpu") == "cpu"
    with pytest.raises(ValueError, match="CPU devices only"):
        select_backend("cuda")


def get_ops_ref():
    from kernels.dispatch import _ops

    return _ops("ref")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "Hq%d-Hkv%d-D%d-bs%d" % s)
@pytest.mark.parametrize("splits", [None, 1, 2, 3])
def test_rows_reading_the_same_keys_attend_together_with_their_own_bits(shape, dtype, splits, threads):
    """A speculative step's draft rows of one sequence (equal block tables, lengths L .. L + 3) share an item that
    loads each K/V tile once; each row must still be the same bits as when it reads its keys through blocks of its
    own (copies, so no two rows share a table), beside rows of other sequences and a row whose table agrees with
    the drafts' in its first block only."""
    hq, hkv, dim, bs = shape
    case = make_paged_case([1] * 3, [290, 35, 2 * bs], hq, hkv, dim, bs, dtype, seed=7 + dim)
    draft = case.block_tables[0]
    other = case.block_tables[1].clone()
    tail = case.block_tables[2].clone()
    tail[:1] = draft[:1]  # shares its first block with the drafts, not its second
    lens = torch.tensor([287, 288, 289, 290, 35, 2 * bs, 1], dtype=torch.int32)
    shared = torch.stack([draft, draft, draft, draft, other, tail, draft]).contiguous()
    # the same keys through copies of the drafts' blocks: every row its own table
    used = -(-290 // bs)
    num_blocks = case.k_cache.shape[0]
    copies = [draft[:used]] + [torch.arange(num_blocks + i * used, num_blocks + (i + 1) * used, dtype=torch.int32)
                               for i in range(4)]
    k = torch.cat([case.k_cache] + [case.k_cache[draft[:used].long()]] * 4)
    v = torch.cat([case.v_cache] + [case.v_cache[draft[:used].long()]] * 4)
    own = shared.clone()
    for row in range(1, 4):
        own[row, :used] = copies[row]
    own[6, :used] = copies[4]
    q = torch.randn(shared.shape[0], hq, dim, generator=torch.Generator().manual_seed(3)).to(dtype)
    together = paged_decode_attention_cpu(q, k, v, shared, lens, case.scale, num_splits=splits)
    apart = paged_decode_attention_cpu(q, k, v, own, lens, case.scale, num_splits=splits)
    for row in range(shared.shape[0]):
        assert torch.equal(together[row], apart[row]), row
