"""kernels/csrc/int4_gemm.c gives PyTorch's `_weight_int4pack_mm_for_cpu` bits at every row count.

The engine switches between the two by row count (kernels.int4_gemm_cpu.int4_matmul), in the default mode on
CPUs without 16-bit GEMM hardware and in batch-invariant mode everywhere, on the promise that it makes no
difference to any bit. These tests hold it to that on the machine that runs them, against the live PyTorch
kernel, at SmolLM2's layer shapes, narrow last column blocks, row counts across the register tile and task
sizes, thread counts and strided inputs.
"""

from __future__ import annotations

import pytest
import torch

from kernels import int4_gemm_cpu

pytestmark = pytest.mark.skipif(int4_gemm_cpu.variant() is None,
                                reason="no native library, or no C variant matches this torch's int4 kernel")


def packed_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    scales = torch.rand(k // 32, n, generator=gen) * 0.02
    zeros = (torch.rand(k // 32, n, generator=gen) - 0.5) * 0.1
    sz = torch.stack((scales, zeros), dim=-1).to(torch.bfloat16).contiguous()
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), sz


def aten(x, packed, sz):
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, 32, sz)


def native(x, packed, sz):
    return int4_gemm_cpu._native(int4_gemm_cpu.library(), x, packed, sz, int4_gemm_cpu.variant())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (3072, 576), (80, 64), (48, 96)])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 64, 97, 200])
def test_the_c_gemm_gives_pytorchs_bits(n, k, rows):
    packed, sz = packed_weight(n, k, seed=n + k)
    x = (torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 2).to(torch.bfloat16)
    assert same_bits(native(x, packed, sz), aten(x, packed, sz))


def test_any_thread_count_and_a_strided_input_give_the_same_bits():
    packed, sz = packed_weight(960, 576, seed=3)
    wide = torch.randn(70, 700, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x = wide[:, 50:626]  # row stride 700
    want = aten(x, packed, sz)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            assert same_bits(native(x, packed, sz), want)
    finally:
        torch.set_num_threads(threads)


def test_int4_matmul_picks_by_rows_and_a_row_never_depends_on_the_others():
    packed, sz = packed_weight(576, 576, seed=5)
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    assert int4_gemm_cpu.native_rows(int4_gemm_cpu.NATIVE_MIN_ROWS)
    assert not int4_gemm_cpu.native_rows(int4_gemm_cpu.NATIVE_MIN_ROWS - 1)
    alone = int4_gemm_cpu.int4_matmul(x[:1], packed, sz)  # PyTorch's kernel
    together = int4_gemm_cpu.int4_matmul(x, packed, sz)  # the C kernel
    assert same_bits(together[:1], alone)
    assert same_bits(together, aten(x, packed, sz))


def test_shapes_it_does_not_take_are_refused_without_writing():
    lib = int4_gemm_cpu.library()
    out = torch.zeros(2, 40, dtype=torch.bfloat16)
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    # N not a multiple of 16, K not a multiple of the group, an unknown variant
    assert lib.int4_gemm(x.data_ptr(), 0, 0, out.data_ptr(), 2, 40, 64, 64, 40, 32, 0, 1) == 1
    assert lib.int4_gemm(x.data_ptr(), 0, 0, out.data_ptr(), 2, 32, 48, 64, 32, 32, 0, 1) == 1
    assert lib.int4_gemm(x.data_ptr(), 0, 0, out.data_ptr(), 2, 32, 64, 64, 32, 32, 7, 1) == 1
    assert torch.count_nonzero(out) == 0
    with pytest.raises(ValueError):
        int4_gemm_cpu._native(lib, torch.zeros(2, 48, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.uint8),
                              torch.zeros(1, 40, 2, dtype=torch.bfloat16), 0)
