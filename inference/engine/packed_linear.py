"""A Linear layer that can also hold its weight as packed 4-bit groups.

Decoding a few sequences multiplies a handful of rows by every weight, so on
the CPU it is bound by memory bandwidth: the step takes as long as streaming
every bf16 weight. When the weight came from a Q4_0/Q4_1
GGUF tensor it is exactly `(code - 8) * scale + zero` per group of 32 inputs,
which PyTorch's `_weight_int4pack_mm_for_cpu` reads at a quarter of the bytes.
So a layer keeps both: the dense weight (AMX/oneDNN GEMM, best for prefill and
large batches; on CPUs without 16-bit GEMM hardware computed in float32, see
cpu_matmul) and, on the CPU in bf16/fp16, the packed copy used for inputs of
at most `INT4_MAX_ROWS` rows (where cpu_matmul upcasts, i.e. there is no 16-bit GEMM hardware: at every row
count in bf16, through kernels/int4_gemm_cpu's GEMM from 8 rows, which gives PyTorch's int4 bits as fast as the
float32 GEMM; `INT4_MAX_ROWS_UPCAST` without it). float32 always uses the dense weight, so the
float32 model stays exactly the dequantised one.

`Int8Blocks` does the same, in bf16, for a weight whose blocks of 32 are
exactly int8 codes times one scale (Q8_0; Q5_0 and Q4_0 shifted to signed
codes), or blocks of 16 (Q6_K: 6-bit codes shifted to signed, each
sub-block's scale d * sc): the native kernel in kernels/q8_matmul_cpu.py multiplies up to
`INT8_MAX_ROWS` rows by them, half the bytes of the bf16 GEMV. It serves the
LM head (for SmolLM2, the tied 49,152 x 576 token embedding) and, for up to
`INT8_LAYER_MAX_ROWS` rows, the Linears that have no int4 copy (Gemma 3's
Q5_0/Q8_0 projections and Q6_K ffn_down); the layer's result is its float32 sum
rounded once to the layer's dtype (by the kernel), as the dense bf16 GEMM rounds
its float32 accumulators. `Q5Blocks` keeps a Linear whose sources are all Q5_0 as the file's own bytes
(22 a block, not 36) where the native kernel has a loop for them, with the same results bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kernels import int4_gemm_cpu

from . import cpu_matmul

GROUP_SIZE = 32
# Each limit stays below the row count where the dense path catches up with the packed one.
INT4_MAX_ROWS = 8  # against oneDNN's bf16 GEMM (AMX CPUs), which catches up near 12 rows
INT4_MAX_ROWS_UPCAST = 16  # against cpu_matmul's float32 upcast (no bf16 GEMM), which catches up at 16-24
# The same CPUs with kernels.int4_gemm_cpu's many-row GEMM (bf16): the int4 copy at every row count. That GEMM
# was 1.3-1.9x the float32 upcast at 16-64 rows and 0.86-1.3x at 256 (benchmarks/int4_gemm.py, AMD EPYC Zen 3,
# AVX2, 2 threads), and one kernel's bits at every row count make a row's result independent of the others in
# its step.
INT4_ALL_ROWS = 1 << 62
# The int8 LM head is faster than the dense bf16 one up to 8 rows, by less as rows grow; the C code
# takes 8 rows per pass, so 16 would read the codes twice.
INT8_MAX_ROWS = 8
# Ordinary layers (K = 640..2048, N = 640..4096): the int8 kernel halves the dense time at 1-2 rows, ties
# it near 4 and loses from 6 (benchmarks/packed_matmul.py, 2-vCPU EPYC, AVX-512 BF16).
INT8_LAYER_MAX_ROWS = 4


@dataclass
class Int4Groups:
    """weight[n, k] = (codes[n, k] - 8) * scales[n, k // 32] + zeros[n, k // 32]."""

    codes: torch.Tensor  # uint8 [N, K], values 0..15
    scales: torch.Tensor  # float32 [N, K // 32]
    zeros: torch.Tensor  # float32 [N, K // 32]

    def map_rows(self, fn) -> Int4Groups:
        return Int4Groups(fn(self.codes), fn(self.scales), fn(self.zeros))

    @staticmethod
    def cat(parts: list[Int4Groups]) -> Int4Groups:
        return Int4Groups(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                          torch.cat([p.zeros for p in parts]))

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        values = (self.codes.view(n, k // GROUP_SIZE, GROUP_SIZE).float() - 8.0) * self.scales.unsqueeze(-1)
        return (values + self.zeros.unsqueeze(-1)).view(n, k)


@dataclass
class Int8Blocks:
    """weight[n, k] = codes[n, k] * scales[n, k // block]: block 32 (GGUF Q8_0, Q5_0, Q4_0) or 16 (Q6_K),
    read from the shapes (kernels.q8_matmul_cpu.block_of)."""

    codes: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # float32 [N, K // block]

    def map_rows(self, fn) -> Int8Blocks:
        return Int8Blocks(fn(self.codes), fn(self.scales))

    @staticmethod
    def cat(parts: list[Int8Blocks]) -> Int8Blocks | None:
        """The parts joined by rows; None when their blocks differ (one scale tensor cannot hold both)."""
        if len({p.codes.shape[1] // p.scales.shape[1] for p in parts}) != 1:
            return None
        return Int8Blocks(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]))

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """x @ weight.T for x [rows, K]: the float32 sums, in ``out_dtype`` (float32 or bf16: rounded once)."""
        from kernels.q8_matmul_cpu import q8_matmul_cpu

        return q8_matmul_cpu(x, self.codes, self.scales, out_dtype)

    def dequantize(self) -> torch.Tensor:
        from kernels.q8_matmul_cpu import q8_dequantize

        return q8_dequantize(self.codes, self.scales)


@dataclass
class Q5Blocks:
    """A Q5_0 weight as the GGUF file holds it: uint8 [N, K / 32 * 22] (per block an fp16 scale, 32 high bits and
    16 bytes of nibbles). The native kernel reads these 22 bytes a block instead of the int8 form's 36, with the
    int8 form's very bits (kernels.q8_matmul_cpu.q5_matmul_cpu); kept only where it runs (AVX-512 builds)."""

    blocks: torch.Tensor

    def map_rows(self, fn) -> Q5Blocks:
        return Q5Blocks(fn(self.blocks))

    @staticmethod
    def cat(parts: list[Q5Blocks]) -> Q5Blocks:
        return Q5Blocks(torch.cat([p.blocks for p in parts]))

    @property
    def shape(self) -> tuple[int, int]:
        from kernels.q8_matmul_cpu import Q5_BYTES

        return self.blocks.shape[0], self.blocks.shape[1] // Q5_BYTES * 32

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        from kernels.q8_matmul_cpu import q5_matmul_cpu

        return q5_matmul_cpu(x, self.blocks, out_dtype)


def int8_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """The int8 LM head and layers: on the CPU in bf16 with the native kernels (which take bf16 or float32 inputs;
    float32 models keep the dense weight, so they stay exactly the dequantised model)."""
    from kernels import cpu_native

    return device.type == "cpu" and dtype == torch.bfloat16 and cpu_native.available()


def int4_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)
            and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"))


class Linear(nn.Linear):
    """nn.Linear plus an optional packed int4 or int8 copy of the weight for few-row inputs."""

    int8: Int8Blocks | Q5Blocks | None = None
    int4_weight: torch.Tensor | None = None
    int4_scales_zeros: torch.Tensor | None = None
    prepacked: torch.Tensor | None = None  # oneDNN-blocked copy of the weight (cpu_matmul.prepack)

    def prepack(self) -> bool:
        self.prepacked = cpu_matmul.prepack(self.weight)
        return self.prepacked is not None

    def attach_int4(self, groups: Int4Groups) -> bool:
        """Pack `groups` (which must describe this layer's weight); False if the shapes do not pack."""
        n, k = groups.codes.shape
        if (n, k) != tuple(self.weight.shape) or k % GROUP_SIZE or not int4_supported(self.weight.device,
                                                                                         self.weight.dtype):
            return False
        try:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.codes.to(torch.int32), 1)
        except RuntimeError:
            return False
        dtype = self.weight.dtype
        self.int4_scales_zeros = torch.stack((groups.scales.t(), groups.zeros.t()), dim=-1).to(dtype).contiguous()
        self.int4_weight = packed
        return True

    def attach_int8(self, blocks: Int8Blocks | Q5Blocks) -> bool:
        """Keep `blocks` (which must describe this layer's weight); False if they do not fit or cannot run."""
        from kernels.q8_matmul_cpu import BLOCKS, block_of, q5_supported

        if isinstance(blocks, Q5Blocks):
            if tuple(blocks.shape) != tuple(self.weight.shape) or not (
                    int8_supported(self.weight.device, self.weight.dtype) and q5_supported()):
                return False
            self.int8 = Q5Blocks(blocks.blocks.contiguous())
            return True
        if (tuple(blocks.codes.shape) != tuple(self.weight.shape)
                or block_of(blocks.codes, blocks.scales) not in BLOCKS
                or not int8_supported(self.weight.device, self.weight.dtype)):
            return False
        self.int8 = Int8Blocks(blocks.codes.contiguous(), blocks.scales.float().contiguous())
        return True

    def int4_max_rows(self) -> int:
        dtype = self.weight.dtype
        if not cpu_matmul.upcast_enabled(dtype):
            return INT4_MAX_ROWS
        if dtype == torch.bfloat16 and int4_gemm_cpu.variant() is not None:
            return INT4_ALL_ROWS
        return INT4_MAX_ROWS_UPCAST

    def forward(self, x: torch.Tensor, fixed=None) -> torch.Tensor:
        """``fixed``: the kernel set's batch-invariant matmul (``Ops.fixed_matmul``), which then multiplies
        by the dense weight whatever the row count (inference.engine.invariant_mode), or, where this layer has
        the packed int4 copy, that one whatever the row count: PyTorch's int4 kernel reduces each output over K
        in one order for any number of rows and threads (rows tile the work, K is never split), and
        kernels.int4_gemm_cpu, which takes many rows, gives the same bits (tests/engine/test_invariant_int4.py
        checks the invariance)."""
        if fixed is not None:
            if self.int4_weight is not None and x.dim() == 2 and x.dtype == self.weight.dtype:
                out = int4_gemm_cpu.int4_matmul(x, self.int4_weight, self.int4_scales_zeros)
            else:
                out = fixed(x, self.weight)
            return out if self.bias is None else out + self.bias
        if self.int4_weight is not None and x.dim() == 2 and x.shape[0] <= self.int4_max_rows():
            out = int4_gemm_cpu.int4_matmul(x, self.int4_weight, self.int4_scales_zeros)
            return out if self.bias is None else out + self.bias
        if self.int8 is not None and x.dim() == 2 and x.shape[0] <= INT8_LAYER_MAX_ROWS:
            out = self.int8.matmul(x, self.weight.dtype)
            return out if self.bias is None else out + self.bias
        if self.prepacked is not None and x.dim() == 2 and x.dtype == self.weight.dtype:
            return cpu_matmul.prepacked_linear(x, self.prepacked, self.bias)
        return cpu_matmul.linear(x, self.weight, self.bias)
