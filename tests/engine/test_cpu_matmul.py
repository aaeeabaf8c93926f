"""cpu_matmul: bfloat16/float16 CPU matmuls computed in float32 where the CPU lacks 16-bit GEMM."""

import pytest
import torch
import torch.nn.functional as F

from inference.engine import cpu_matmul, packed_linear
from inference.engine.packed_linear import Int4Groups, Linear
from kernels import int4_gemm_cpu


def _exact(x, w, b=None):
    """The float64 product of the 16-bit values: what a float32 accumulation approximates."""
    out = x.double() @ w.double().t()
    return out if b is None else out + b.double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [7, cpu_matmul.CHUNK_ROWS, cpu_matmul.CHUNK_ROWS * 2 + 5])
def test_upcast_linear_is_a_float32_product_rounded_once(dtype, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(9, 96, generator=g).to(dtype)
    w = torch.randn(n, 96, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    out = cpu_matmul.upcast_linear(x, w, b)
    assert out.dtype == dtype and out.shape == (9, n)
    # Rounded once from a float32 accumulation: within one 16-bit rounding step of the exact result,
    # and equal to the unchunked float32 product rounded to the dtype.
    exact = _exact(x, w, b)
    step = exact.abs() * (2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11) + 1e-3
    assert ((out.double() - exact).abs() <= step).all()
    whole = F.linear(x.float(), w.float(), b.float()).to(dtype)
    assert torch.equal(out, whole)


def test_upcast_linear_keeps_leading_dimensions():
    x = torch.randn(2, 5, 64).to(torch.bfloat16)
    w = torch.randn(cpu_matmul.CHUNK_ROWS + 3, 64).to(torch.bfloat16)
    out = cpu_matmul.upcast_linear(x, w)
    assert out.shape == (2, 5, cpu_matmul.CHUNK_ROWS + 3)
    assert torch.equal(out.view(10, -1), cpu_matmul.upcast_linear(x.view(10, 64), w))


@pytest.mark.parametrize("mode,native,expected", [
    ("auto", False, True), ("auto", True, False), ("1", True, True), ("0", False, False), (" AUTO ", False, True),
])
def test_upcast_mode_follows_the_setting_and_the_cpu(monkeypatch, cpu_matmul_config, mode, native, expected):
    cpu_matmul_config(upcast=mode)
    monkeypatch.setattr(cpu_matmul, "_native_16bit_gemm", lambda dtype: native)
    assert cpu_matmul.upcast_enabled(torch.bfloat16) is expected
    assert cpu_matmul.upcast_enabled(torch.float16) is expected
    assert cpu_matmul.upcast_enabled(torch.float32) is False  # float32 is never touched


def test_a_bad_setting_is_a_clear_error(cpu_matmul_config):
    with pytest.raises(ValueError, match=r"\(ENGINE_CPU_UPCAST_MATMUL\) must be auto, 0 or 1"):
        cpu_matmul_config(upcast="sometimes")


def test_linear_upcasts_only_inputs_with_enough_rows(monkeypatch, cpu_matmul_config):
    cpu_matmul_config(upcast="1")
    w = torch.randn(300, 64).to(torch.bfloat16)
    calls = []
    real = cpu_matmul.upcast_linear
    monkeypatch.setattr(cpu_matmul, "upcast_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    few = torch.randn(cpu_matmul.UPCAST_MIN_ROWS - 1, 64).to(torch.bfloat16)
    many = torch.randn(cpu_matmul.UPCAST_MIN_ROWS, 64).to(torch.bfloat16)
    assert torch.equal(cpu_matmul.linear(few, w), F.linear(few, w))
    assert torch.equal(cpu_matmul.linear(many, w), real(many, w))
    assert calls == [many.shape]
    cpu_matmul_config(upcast="0")
    assert torch.equal(cpu_matmul.linear(many, w), F.linear(many, w))
    assert calls == [many.shape]


def _upcast_q4_layer(cpu_matmul_config, monkeypatch):
    if not packed_linear.int4_supported(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this torch has no CPU int4 matmul")
    cpu_matmul_config(upcast="1")
    g = torch.Generator().manual_seed(0)
    n, k = 64, 96
    groups = Int4Groups(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                        torch.rand(n, k // 32, generator=g) * 0.02, torch.rand(n, k // 32, generator=g) * 0.01)
    layer = Linear(k, n, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(groups.dequantize())
    assert layer.attach_int4(groups)
    seen = []
    monkeypatch.setattr(cpu_matmul, "upcast_linear", lambda x, w, b=None: seen.append(x.shape[0]) or F.linear(
        x.float(), w.float()).to(x.dtype))
    return layer, g, seen


def test_packed_layer_picks_int4_then_upcast_by_rows(monkeypatch, cpu_matmul_config):
    """A Q4 layer on a CPU without bf16 GEMM and without the C int4 GEMM: int4 up to INT4_MAX_ROWS_UPCAST rows,
    float32 above."""
    monkeypatch.setattr(int4_gemm_cpu, "_variant", {"v": None})
    layer, g, seen = _upcast_q4_layer(cpu_matmul_config, monkeypatch)
    limit = packed_linear.INT4_MAX_ROWS_UPCAST
    for rows in (1, limit, limit + 1):
        x = torch.randn(rows, 96, generator=g).to(torch.bfloat16)
        out = layer(x)
        ref = _exact(x, layer.weight)
        assert torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0) > 0.999
    assert seen == [limit + 1]
    cpu_matmul_config(upcast="0")
    assert layer.int4_max_rows() == packed_linear.INT4_MAX_ROWS


def test_packed_layer_takes_int4_at_every_row_count_with_the_c_gemm(monkeypatch, cpu_matmul_config):
    """With kernels.int4_gemm_cpu's GEMM, the same layer takes its int4 copy at every row count (PyTorch's
    kernel's bits throughout, so a row's result is the same alone or among 300), never the float32 upcast."""
    if int4_gemm_cpu.variant() is None:
        pytest.skip("no C int4 GEMM matching this torch's int4 kernel")
    layer, g, seen = _upcast_q4_layer(cpu_matmul_config, monkeypatch)
    assert layer.int4_max_rows() == packed_linear.INT4_ALL_ROWS
    x = torch.randn(300, 96, generator=g).to(torch.bfloat16)
    together = layer(x)
    assert torch.equal(together.view(torch.int16), torch.ops.aten._weight_int4pack_mm_for_cpu(
        x, layer.int4_weight, 32, layer.int4_scales_zeros).view(torch.int16))
    for rows in (1, 7, 16, 17, 64):
        assert torch.equal(layer(x[:rows]).view(torch.int16), together[:rows].view(torch.int16))
    assert seen == []


def _native_bf16() -> bool:
    return cpu_matmul._native_16bit_gemm(torch.bfloat16) and not cpu_matmul.upcast_enabled(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 7, 64, 300, 1024])
def test_prepacked_linear_equals_f_linear(rows):
    if not _native_bf16():
        pytest.skip("no native bf16 GEMM on this CPU: weights are not prepacked here")
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(3072, 576, generator=g).to(torch.bfloat16)
    b = torch.randn(3072, generator=g).to(torch.bfloat16)
    packed = cpu_matmul.prepack(w)
    assert packed is not None
    x = torch.randn(rows, 576, generator=g).to(torch.bfloat16)
    assert torch.equal(cpu_matmul.prepacked_linear(x, packed), F.linear(x, w))
    assert torch.equal(cpu_matmul.prepacked_linear(x, packed, b), F.linear(x, w, b))


def test_prepack_applies_only_to_native_bf16_weights(monkeypatch, cpu_matmul_config):
    w = torch.randn(64, 32)
    assert cpu_matmul.prepack(w) is None  # float32 stays the plain product
    monkeypatch.setattr(cpu_matmul, "_native_16bit_gemm", lambda dtype: False)
    assert cpu_matmul.prepack(w.to(torch.bfloat16)) is None  # upcast CPUs: float32 GEMMs instead
    monkeypatch.setattr(cpu_matmul, "_native_16bit_gemm", lambda dtype: True)
    cpu_matmul_config(prepack=False)
    assert cpu_matmul.prepack(w.to(torch.bfloat16)) is None


def test_prepacked_layer_multiplies_by_the_packed_weight(monkeypatch):
    if not _native_bf16():
        pytest.skip("no native bf16 GEMM on this CPU: weights are not prepacked here")
    layer = Linear(96, 64, bias=True).to(torch.bfloat16)
    assert layer.prepack() and layer.prepacked is not None
    calls = []
    real = cpu_matmul.prepacked_linear
    monkeypatch.setattr(cpu_matmul, "prepacked_linear", lambda x, p, b=None: calls.append(p) or real(x, p, b))
    x = torch.randn(20, 96).to(torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert calls == [layer.prepacked]
    assert layer(x.view(4, 5, 96)).shape == (4, 5, 64) and len(calls) == 1  # 3-D inputs: plain F.linear


def test_int8_head_only_where_the_native_kernel_takes_the_inputs():
    cpu = torch.device("cpu")
    assert not packed_linear.int8_supported(cpu, torch.float32)  # float32 stays the dequantised model
    assert not packed_linear.int8_supported(cpu, torch.float16)  # the kernel takes bf16/fp32 inputs only
    assert not packed_linear.int8_supported(torch.device("meta"), torch.bfloat16)
