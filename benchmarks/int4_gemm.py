"""The int4 matmul at decode and prefill row counts: PyTorch's kernel, the C GEMM that gives its bits
(kernels/int4_gemm_cpu.py) and the dense float32 GEMM (cpu_matmul's upcast path on CPUs without bf16 GEMM),
at SmolLM2's layer shapes (CPU).

    python benchmarks/int4_gemm.py [--rows 1 4 8 16 64 256 512] [--reps 30] [--threads N] [--json]

Per shape [N, K] and row count: median milliseconds per call of each, and whether the C GEMM's output
equals PyTorch's bit for bit (it must: the engine switches between them by row count). The weights are one
copy per shape (they stay in cache at these sizes, which flatters the few-row figures; benchmarks/
packed_matmul.py streams them from memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from kernels import int4_gemm_cpu  # noqa: E402

SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def _median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 64, 256, 512])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    variant = int4_gemm_cpu.variant()
    if variant is None:
        sys.exit("no C variant matches this torch's int4 kernel (or no native library): nothing to compare")
    lib = int4_gemm_cpu.library()
    gen = torch.Generator().manual_seed(0)
    results = []
    for name, (n, k) in SHAPES.items():
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        sz = (torch.rand(k // 32, n, 2, generator=gen) * 0.02).to(torch.bfloat16).contiguous()
        dense = torch.randn(n, k, generator=gen)
        for rows in args.rows:
            x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
            ours = int4_gemm_cpu._native(lib, x, packed, sz, variant)
            theirs = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)
            row = {"shape": name, "n": n, "k": k, "rows": rows,
                   "pytorch_int4_ms": _median_ms(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
                       x, packed, 32, sz), args.reps),
                   "c_int4_ms": _median_ms(lambda: int4_gemm_cpu._native(lib, x, packed, sz, variant), args.reps),
                   "dense_f32_ms": _median_ms(lambda: torch.nn.functional.linear(x.float(), dense).to(
                       torch.bfloat16), args.reps),
                   "same_bits": bool(torch.equal(ours.view(torch.int16), theirs.view(torch.int16)))}
            results.append(row)
            if not args.json:
                print(f"{name:8s} {n}x{k} rows {rows:4d}: pytorch int4 {row['pytorch_int4_ms']:.3f} ms, "
                      f"C int4 {row['c_int4_ms']:.3f}, dense f32 {row['dense_f32_ms']:.3f}, "
                      f"same bits {row['same_bits']}")
    summary = {"threads": torch.get_num_threads(), "variant": variant, "results": results}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
