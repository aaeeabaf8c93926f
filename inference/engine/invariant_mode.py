"""Batch-invariant mode: a row's result does not depend on the other rows of its step.

Without it, the same seeded request can give other tokens when other requests
run beside it, because a row is reduced differently depending on the step: on
the CPU a few-row step multiplies by the packed int4 weight and a larger one by
the dense GEMM (and a library GEMM picks its own kernel and blocking from the
row count); the decode attention kernel splits each sequence into as many
parts as the batch leaves threads idle; a mixed step sends its decodes to the
decode kernel and its prompt rows to the prefill kernel, so a prompt's last
token differs between a whole prefill and a chunked one whose last chunk is
one token; and a token's K/V computed inside a chunk differs from the same
token's K/V computed in a whole prefill, which the prefix cache then serves.

With `EngineConfig.batch_invariant` every step is composed so that each row is
computed the same way in any step:

- every matmul (the four per layer and the LM head) goes through
  `Ops.fixed_matmul`, which reduces each output in one fixed order whatever the
  row count (kernels/csrc/fixed_matmul.c on the CPU, kernels/fixed_matmul.py's
  single-configuration Triton kernel on CUDA); a bf16 model with an int8 LM
  head keeps that head's native kernel, whose rows never interact (from 5 rows,
  on AVX2 builds, kernels/csrc/q8_gemm.c: the same bits, fast at many rows),
  and a bf16 CPU layer with a packed int4 copy multiplies by it at every row
  count through kernels.int4_gemm_cpu: PyTorch's int4 kernel for few rows, and
  from 8 rows a C GEMM that gives that kernel's very bits (checked against the
  live kernel at first use), so its rows never interact either
  (packed_linear.Linear.forward, tests/engine/test_invariant_int4.py,
  tests/kernels/test_int4_gemm_cpu.py);
- attention runs one query row at a time over its own sequence's keys up to
  its own position (`Ops.paged_attention_rows`, kernels/row_attention.py):
  no split depends on the batch, and a prompt token's attention is the same
  computation in a whole prefill, in any chunk and as a one-token decode;
- so a token's K/V (the projection of a row that was computed the same way)
  are the same bits whether computed in a chunk, in a whole prefill or served
  from the prefix cache; the norms, rotary and activation kernels were already
  per row, and the sampler's per-request generators make seeded draws
  independent of the batch;
- CUDA graphs are off (they replay the decode kernel).

The costs (measured by benchmarks/batch_invariant_ab.py, see BENCHMARKS.md): where
the default takes the fastest kernel for each row count (a bf16 GEMM on CPUs
with 16-bit GEMM hardware, on CUDA) this mode gives that up; on CPUs without it
the default already multiplies int4 layers through the same kernels at every
row count (packed_linear.INT4_ALL_ROWS), and what is left is the LM head above
8 rows (int8 panel GEMM against the float32 GEMM), attention parts of a fixed size,
and prefill attention read row by row. `rows_metadata` builds the per-row attention inputs once a step.
"""

from __future__ import annotations

import torch

from .attention_metadata import AttentionMetadata


def invariant_default(model, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether batch-invariant mode is on by default for this loaded model (EngineConfig.batch_invariant None):
    where the mode's kernels are the default's own, so it costs little. That is a bf16 Llama-family model the
    native decoder stack runs (every projection with its int4 copy), on a CPU without 16-bit GEMM hardware
    (where the default takes the int4 copies at every row count: packed_linear.INT4_ALL_ROWS), with the int8
    LM head and the C GEMMs that give its and PyTorch's int4 kernel's bits at many rows. Measured there at
    0.98-1.04x of decode at 64 sequences and 0.91-1.02x single stream (BENCHMARKS.md). Elsewhere (CUDA, CPUs with
    bf16 GEMM, float32, other models) the mode gives up faster kernels, so it stays the operator's choice."""
    from kernels import int4_gemm_cpu
    from kernels.q8_matmul_cpu import library as q8_library

    from . import cpu_matmul, native_stack

    if device.type != "cpu" or dtype != torch.bfloat16 or not cpu_matmul.upcast_enabled(dtype):
        return False
    if int4_gemm_cpu.variant() is None or getattr(model, "output_int8", None) is None:
        return False
    lib = q8_library()
    if lib is None or lib.q8_matmul_isa() != 1:  # the q8 GEMM's loop is in AVX2 builds only (kernels/csrc/q8_gemm.c)
        return False
    return native_stack.eligible(model)


def rows_metadata(meta: AttentionMetadata, positions: torch.Tensor, num_new_tokens: list[int]) -> None:
    """Fill meta's row_block_tables / row_seq_lens (each row: its sequence's table; its position + 1)."""
    meta.batch_invariant = True
    if meta.decode_only:  # one row per sequence, at its last position: the per-sequence tensors already
        meta.row_block_tables, meta.row_seq_lens = meta.block_tables, meta.seq_lens
        return
    device = positions.device
    counts = torch.tensor(num_new_tokens, dtype=torch.int64)
    row_seq = torch.repeat_interleave(torch.arange(len(num_new_tokens)), counts)
    if device.type == "cuda":  # pinned, queued behind the GPU's work (a pageable copy would wait for it)
        row_seq = row_seq.pin_memory().to(device, non_blocking=True)
    else:
        row_seq = row_seq.to(device)
    meta.row_block_tables = meta.block_tables.index_select(0, row_seq)
    meta.row_seq_lens = (positions + 1).to(torch.int32)
