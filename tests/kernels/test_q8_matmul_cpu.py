"""The native Q8_0 matmul (kernels/csrc/q8_matmul.c) against the float64 product with the exact weights."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_native
from kernels import q8_matmul_cpu as q8

pytestmark = pytest.mark.skipif(q8.library() is None, reason="no C compiler: the native CPU kernels cannot be built")


def _case(rows: int, n: int, k: int, dtype: torch.dtype, seed: int = 0, block: int = q8.BLOCK):
    g = torch.Generator().manual_seed(seed + rows * 7 + n + k)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    scales = (torch.rand(n, k // block, generator=g) * 0.02).half().float()  # fp16 scales, as in a file
    x = (torch.randn(rows, k, generator=g) * 2).to(dtype)
    return x, codes, scales


def _check(out: torch.Tensor, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """Within float32 summation error of the float64 product (bounded by sum |x| |w| * K * eps)."""
    n, k = codes.shape
    block = k // scales.shape[1]
    weight = (codes.double().view(n, k // block, block) * scales.double().unsqueeze(-1)).view(n, k)
    exact = x.double() @ weight.t()
    bound = (x.double().abs() @ weight.abs().t()) * (k * 2.0 ** -24) + 1e-30
    assert out.dtype == torch.float32 and out.shape == exact.shape
    assert bool(((out.double() - exact).abs() <= bound).all()), float((out.double() - exact).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,n,k", [(1, 1, 32), (1, 200, 576), (3, 65, 96), (8, 64, 576), (9, 130, 64),
                                      (17, 31, 128)])
def test_matches_the_exact_product(dtype, rows, n, k):
    x, codes, scales = _case(rows, n, k, dtype)
    _check(q8.q8_matmul_cpu(x, codes, scales), x, codes, scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,n,k", [(1, 1, 16), (1, 200, 640), (3, 65, 48), (8, 64, 2048), (9, 130, 80)])
def test_blocks_of_16_match_the_exact_product(dtype, rows, n, k):
    """Q6_K's sub-blocks: a scale per 16 codes."""
    x, codes, scales = _case(rows, n, k, dtype, block=16)
    assert q8.block_of(codes, scales) == 16
    _check(q8.q8_matmul_cpu(x, codes, scales), x, codes, scales)


@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("rows", [1, 4, 11])
def test_bf16_output_is_the_float32_result_rounded_once(block, rows):
    x, codes, scales = _case(rows, 96, 320, torch.bfloat16, block=block)
    want = q8.q8_matmul_cpu(x, codes, scales).to(torch.bfloat16)
    got = q8.q8_matmul_cpu(x, codes, scales, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    wide = torch.cat((x, x), dim=1)[:, :320]  # strided rows
    assert torch.equal(q8.q8_matmul_cpu(wide, codes, scales, torch.bfloat16), want)


def test_strided_rows_and_the_reference():
    x, codes, scales = _case(5, 70, 160, torch.bfloat16)
    wide = torch.cat((x, torch.ones(5, 32, dtype=x.dtype)), dim=1)[:, :160]  # row stride 192
    out = q8.q8_matmul_cpu(wide, codes, scales)
    _check(out, x, codes, scales)
    torch.testing.assert_close(out, q8.q8_matmul_ref(x, codes, scales), rtol=1e-5, atol=1e-4)
    assert q8.q8_matmul_cpu(x[:0], codes, scales).shape == (0, 70)


def test_bad_inputs_raise():
    x, codes, scales = _case(2, 8, 64, torch.float32)
    with pytest.raises(ValueError, match="multiple of the block"):
        q8.q8_matmul_cpu(x[:, :48], codes[:, :48], scales[:, :1])
    with pytest.raises(ValueError, match="multiple of the block"):  # blocks of 8: not a kernel's
        q8.q8_matmul_cpu(x, codes, torch.ones(8, 8))
    with pytest.raises(ValueError, match="do not match"):
        q8.q8_matmul_cpu(x[:, :32], codes, scales)
    with pytest.raises(ValueError, match="int8"):
        q8.q8_matmul_cpu(x, codes.to(torch.int16), scales)
    with pytest.raises(ValueError, match="2-D"):
        q8.q8_matmul_cpu(x[0], codes, scales)


def test_other_dtypes_use_the_reference():
    x, codes, scales = _case(2, 8, 64, torch.float32)
    half = x.half()
    assert torch.equal(q8.q8_matmul_cpu(half, codes, scales), q8.q8_matmul_ref(half, codes, scales))


def _flags() -> list[str]:
    return cpu_native._cpu_flags().split()


@pytest.mark.parametrize("isa,extra", [(1, "-mno-avx512f"), (0, "-mno-avx512f -mno-avx2 -mno-fma")],
                         ids=["avx2", "portable"])
def test_narrower_builds_match(fresh_loader, kernel_config, isa, extra):
    """The AVX2 and portable loops, built here by turning the wider instruction sets off."""
    if isa == 1 and not {"avx2", "fma"} <= set(_flags()):
        pytest.skip("no AVX2 + FMA on this CPU: the default build already runs the portable loops")
    if isa == 0 and not {"avx2", "avx512f"} & set(_flags()):
        pytest.skip("the default build already runs the portable loops")
    kernel_config(cc=f"{cpu_native.find_compiler()} {extra}")
    assert q8.library().q8_matmul_isa() == isa
    for dtype in (torch.float32, torch.bfloat16):
        for rows, n, k, block in ((1, 100, 576, 32), (9, 65, 96, 32), (2, 33, 80, 16)):
            x, codes, scales = _case(rows, n, k, dtype, seed=isa, block=block)
            _check(q8.q8_matmul_cpu(x, codes, scales), x, codes, scales)
            assert torch.equal(q8.q8_matmul_cpu(x, codes, scales, torch.bfloat16),
                               q8.q8_matmul_cpu(x, codes, scales).to(torch.bfloat16))


def test_the_default_build_uses_the_widest_loops():
    flags = set(_flags())
    expected = 2 if "avx512f" in flags else 1 if {"avx2", "fma"} <= flags else 0
    assert q8.library().q8_matmul_isa() == expected


@pytest.mark.parametrize("block", [16, 32])
def test_a_rows_result_does_not_depend_on_the_row_count(block):
    """The batch-invariant mode's LM head (inference.engine.invariant_mode) reads these rows: each row's sums
    keep one order whatever the rows beside it (1-9 rows: one and two passes of MAX_ROWS; from GEMM_MIN_ROWS,
    on AVX2 builds, kernels/csrc/q8_gemm.c, whose tiles of 2 rows x 2 channels and groups of 6 rows all end on
    odd remainders here)."""
    # N = 4 * 17 + 3: one row takes 4 outputs at once, then 3 alone; 71 = 48 + 23 channels: a panel and an odd one
    x, codes, scales = _case(41, 71, 192, torch.bfloat16, block=block)
    alone = torch.cat([q8.q8_matmul_cpu(x[i:i + 1], codes, scales) for i in range(41)])
    for rows in (*range(1, 10), 13, 16, 17, 41):
        assert torch.equal(q8.q8_matmul_cpu(x[:rows], codes, scales), alone[:rows]), rows
        assert torch.equal(q8.q8_matmul_cpu(x[:rows], codes, scales, torch.bfloat16),
                           alone[:rows].to(torch.bfloat16)), rows


def _q5_case(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Q5_0 bytes [n, k / 32 * 22]: random nibbles and high bits, fp16 scales (some negative, one subnormal)."""
    g = torch.Generator().manual_seed(seed + n + k)
    nb = k // 32
    raw = torch.randint(0, 256, (n, nb, q8.Q5_BYTES), dtype=torch.uint8, generator=g)
    d = ((torch.rand(n, nb, generator=g) - 0.3) * 0.02).half()
    d.view(-1)[0] = 2.0 ** -24
    raw[:, :, 0:2] = d.view(torch.uint8).view(n, nb, 2)
    return raw.view(n, nb * q8.Q5_BYTES).contiguous()


def test_q5_to_int8_is_the_gguf_dequantisation():
    """The reference unpacking against the loader's own (inference.engine.dequant.int8_blocks) and gguf-py's."""
    from gguf import GGMLQuantizationType, dequantize

    from inference.engine.dequant import int8_blocks

    raw = _q5_case(7, 96)
    codes, scales = q8.q5_to_int8(raw)
    theirs = int8_blocks(raw.numpy(), GGMLQuantizationType.Q5_0, (7, 96))
    assert torch.equal(codes, theirs.codes) and torch.equal(scales, theirs.scales.float())
    reference = torch.from_numpy(dequantize(raw.numpy(), GGMLQuantizationType.Q5_0).copy()).reshape(7, 96)
    assert torch.equal(q8.q8_dequantize(codes, scales), reference.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,n,k", [(1, 1, 32), (1, 200, 640), (3, 65, 96), (8, 64, 2048), (9, 130, 64)])
def test_q5_blocks_give_the_bits_of_their_int8_form(dtype, rows, n, k):
    raw = _q5_case(n, k)
    x = (torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 2).to(dtype)
    codes, scales = q8.q5_to_int8(raw)
    for out_dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(q8.q5_matmul_cpu(x, raw, out_dtype), q8.q8_matmul_cpu(x, codes, scales, out_dtype))
    _check(q8.q5_matmul_cpu(x, raw), x, codes, scales)
    wide = torch.cat((x, x), dim=1)[:, :k]  # strided rows
    assert torch.equal(q8.q5_matmul_cpu(wide, raw), q8.q5_matmul_cpu(x, raw))


def test_q5_a_rows_result_does_not_depend_on_the_row_count():
    raw = _q5_case(70, 192)
    x = torch.randn(9, 192).bfloat16()
    alone = torch.cat([q8.q5_matmul_cpu(x[i:i + 1], raw) for i in range(9)])
    for rows in range(1, 10):
        assert torch.equal(q8.q5_matmul_cpu(x[:rows], raw), alone[:rows]), rows


def test_q5_bad_inputs_raise():
    raw = _q5_case(4, 64)
    with pytest.raises(ValueError, match="uint8"):
        q8.q5_matmul_cpu(torch.randn(1, 64), raw[:, :-1])
    with pytest.raises(ValueError, match="do not match"):
        q8.q5_matmul_cpu(torch.randn(1, 32), raw)


def test_q5_only_where_the_build_has_its_loop(fresh_loader, kernel_config):
    """An AVX2 build has no Q5_0 loop: the native call says so, q5_supported() is False (the loader then keeps
    int8 blocks) and q5_matmul_cpu still answers, through the int8 form."""
    if not {"avx2", "fma"} <= set(_flags()):
        pytest.skip("no AVX2 + FMA on this CPU")
    kernel_config(cc=f"{cpu_native.find_compiler()} -mno-avx512f")
    lib = q8.library()
    raw, x = _q5_case(33, 64), torch.randn(2, 64)
    out = torch.empty(2, 33)
    assert lib.q5_matmul(x.data_ptr(), raw.data_ptr(), out.data_ptr(), 2, 33, 64, 64, 33, 0, 0, 1) == 3
    assert not q8.q5_supported()
    codes, scales = q8.q5_to_int8(raw)
    assert torch.equal(q8.q5_matmul_cpu(x, raw), q8.q8_matmul_cpu(x, codes, scales))


def test_a_library_loaded_after_another_is_freed_gets_its_signatures(fresh_loader, kernel_config):
    """Signatures are bound per loaded library even where a later library could take a freed one's id (bound
    sets keyed by a bare id skipped them: int64 arguments then went as C ints, 'q8_matmul failed with code 1')."""
    import gc

    for flags in ("-O2", "-O3"):
        cpu_native._loaded.clear()
        kernel_config(cc=f"{cpu_native.find_compiler()} {flags}")
        lib = q8.library()
        assert lib.q8_matmul.argtypes is not None and lib.q8_matmul.restype is not None
        x, codes, scales = _case(2, 33, 64, torch.float32)
        _check(q8.q8_matmul_cpu(x, codes, scales), x, codes, scales)
        del lib
        gc.collect()
