"""Batch-invariant mode multiplies a bf16 layer that has the packed int4 copy by PyTorch's int4 kernel at
every row count (packed_linear.Linear.forward with ``fixed``). That holds only while the kernel's rows never
interact: a row's output must be the same bits alone, beside any other rows and on any thread count. These
tests check it on the machine that runs them (torch's kernel picks its AVX-512 or AVX2 body by the CPU), at
SmolLM2's layer shapes; tests/engine/test_batch_invariant.py checks the whole engine on the real model."""

from __future__ import annotations

import pytest
import torch

from inference.engine.packed_linear import Int4Groups, Linear, int4_supported

pytestmark = pytest.mark.skipif(not int4_supported(torch.device("cpu"), torch.bfloat16),
                                reason="this torch build has no CPU int4 kernel")


def groups_of(n: int, k: int, seed: int = 0) -> Int4Groups:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    scales = torch.rand(n, k // 32, generator=gen) * 0.02
    zeros = (torch.rand(n, k // 32, generator=gen) - 0.5) * 0.1
    return Int4Groups(codes, scales, zeros)


def layer_of(groups: Int4Groups) -> Linear:
    n, k = groups.codes.shape
    layer = Linear(k, n, bias=False, dtype=torch.bfloat16)
    layer.requires_grad_(False)
    assert layer.attach_int4(groups)
    return layer


def refuse(x, weight):
    raise AssertionError("the fixed matmul was called for a layer with an int4 copy")


@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (3072, 576)])
def test_a_row_is_the_same_bits_alone_beside_others_and_on_any_thread_count(n, k):
    layer = layer_of(groups_of(n, k))
    x = torch.randn(160, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([layer.forward(x[i:i + 1], refuse) for i in range(x.shape[0])])
        torch.set_num_threads(max(2, threads))
        for rows in (2, 3, 5, 8, 9, 17, 64, 160):
            for start in (0, 7):
                part = x[start:start + rows]
                assert torch.equal(layer.forward(part, refuse), alone[start:start + part.shape[0]]), (rows, start)
    finally:
        torch.set_num_threads(threads)


def test_the_invariant_path_is_the_int4_weights_product_within_bf16():
    groups = groups_of(960, 576)
    layer = layer_of(groups)
    x = torch.randn(12, 576, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    got = layer.forward(x, refuse).double()
    # the groups' weight (Int4Groups: (code - 8) * scale + zero, scales and zeros rounded to bf16 as packed)
    scales = groups.scales.to(torch.bfloat16).double().repeat_interleave(32, dim=1)
    zeros = groups.zeros.to(torch.bfloat16).double().repeat_interleave(32, dim=1)
    want = x.double() @ ((groups.codes.double() - 8) * scales + zeros).t()
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()


def test_a_layer_without_an_int4_copy_keeps_the_fixed_matmul():
    layer = Linear(64, 32, bias=True, dtype=torch.bfloat16)
    layer.requires_grad_(False)
    calls = []

    def fixed(x, weight):
        calls.append(x.shape[0])
        return x @ weight.t()

    x = torch.randn(3, 64).to(torch.bfloat16)
    out = layer.forward(x, fixed)
    assert calls == [3]
    assert torch.equal(out, x @ layer.weight.t() + layer.bias)
