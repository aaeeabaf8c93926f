"""Our vectorised dequantisers against gguf's own `gguf.quants.dequantize`, on synthetic blocks
(random bytes with valid float16 scales, so every bit-packing path is hit) and on real tensors of the
SmolLM2 GGUF."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from inference.engine.dequant import SUPPORTED_TYPES, dequantize, int4_groups

Q = GGMLQuantizationType
# Byte offsets of the float16 scale fields inside one block of each type.
F16_FIELDS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q4_K: [0, 2],
              Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_blocks(qtype, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    type_size = GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scales = rng.uniform(-0.05, 0.05, size=raw.shape[0]).astype(np.float16)
        raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, blocks_per_row * type_size)


@pytest.mark.parametrize("qtype", list(F16_FIELDS), ids=lambda q: q.name)
def test_block_types_equal_gguf_reference_on_synthetic_blocks(qtype):
    raw = random_blocks(qtype, rows=6, blocks_per_row=3)
    expected = gguf_dequantize(raw, qtype)
    ours = dequantize(raw, qtype, expected.shape, torch.float32)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == expected.shape
    np.testing.assert_array_equal(ours.numpy(), expected)  # bit-identical float32


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1],
                         ids=lambda q: q.name)
def test_round_trip_through_gguf_quantize(qtype):
    values = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    raw = gguf_quantize(values, qtype)
    expected = gguf_dequantize(raw, qtype)
    ours = dequantize(raw, qtype, values.shape, torch.float32)
    np.testing.assert_array_equal(ours.numpy(), expected.astype(np.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_target_dtype_is_a_single_rounding_of_float32(dtype):
    raw = random_blocks(Q.Q6_K, rows=2, blocks_per_row=2, seed=3)
    exact = gguf_dequantize(raw, Q.Q6_K)
    ours = dequantize(raw, Q.Q6_K, exact.shape, dtype)
    assert ours.dtype == dtype
    assert torch.equal(ours, torch.from_numpy(exact).to(dtype))


def test_real_tensors_of_the_smollm2_file(gguf_path):
    reader = GGUFReader(str(gguf_path))
    seen = set()
    for tensor in reader.tensors:
        qtype = Q(tensor.tensor_type)
        if qtype in seen and not tensor.name.startswith("blk.29."):
            continue
        seen.add(qtype)
        expected = gguf_dequantize(tensor.data, qtype).astype(np.float32)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        ours = dequantize(tensor.data, qtype, shape, torch.float32)
        np.testing.assert_array_equal(ours.numpy(), expected.reshape(shape))
    assert seen == {Q.F32, Q.Q4_1, Q.Q8_0}


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_int4_groups_reproduce_the_dequantised_weight(qtype):
    raw = random_blocks(qtype, rows=16, blocks_per_row=4, seed=5)
    dense = dequantize(raw, qtype, (16, 128), torch.float32)
    groups = int4_groups(raw, qtype, (16, 128))
    assert groups.codes.dtype == torch.uint8 and int(groups.codes.max()) <= 15
    assert groups.scales.shape == groups.zeros.shape == (16, 4)
    torch.testing.assert_close(groups.dequantize(), dense, rtol=0, atol=1e-6)
    assert int4_groups(random_blocks(Q.Q8_0, 2, 1), Q.Q8_0, (2, 32)) is None


def test_unsupported_type_and_bad_sizes_are_rejected():
    with pytest.raises(NotImplementedError, match="Q3_K"):
        dequantize(np.zeros(110, np.uint8), Q.Q3_K, (256,))
    with pytest.raises(ValueError):
        dequantize(np.zeros(34, np.uint8), Q.Q8_0, (64,))
    assert set(SUPPORTED_TYPES) == {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K,
                                   Q.Q6_K}
