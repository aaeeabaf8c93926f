"""Few-row matmuls of packed weights against the dense bf16 one, at Gemma 3 270M's or SmolLM2's layer shapes (CPU).

    python benchmarks/packed_matmul.py [--shapes gemma3|smollm2] [--rows 1 2 4 8] [--reps 200] [--json]

Per shape [N, K] and row count: the dense bf16 weight (cpu_matmul's path: prepacked oneDNN or plain),
the int8 blocks (kernels/q8_matmul_cpu.py, result rounded to bf16 as packed_linear does) and the int4
groups (torch's _weight_int4pack_mm_for_cpu). Each call takes the next of as many weight copies as
fill 4x the last-level cache, so every weight streams from memory as in a decode step over all layers.
Medians of time.perf_counter, in microseconds per call.
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

from inference.engine import cpu_matmul  # noqa: E402
from inference.engine.packed_linear import Int4Groups, Int8Blocks, Linear  # noqa: E402

SHAPE_SETS = {
    "gemma3": {"qkv": (1536, 640), "o_proj": (640, 1024), "gate_up": (4096, 640), "down": (640, 2048)},
    "smollm2": {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)},
}
CACHE_BYTES = 32 << 20


def _layers(n: int, k: int) -> list[Linear]:
    copies = max(2, 4 * CACHE_BYTES // (n * k * 2))
    layers = []
    for _ in range(copies):
        codes = torch.randint(-16, 16, (n, k), dtype=torch.int8)
        scales = torch.rand(n, k // 32) * 0.01
        blocks = Int8Blocks(codes, scales)
        layer = Linear(k, n, bias=False, dtype=torch.bfloat16)
        layer.weight.data.copy_(blocks.dequantize())
        layer.requires_grad_(False)
        layer.prepack()
        layer.attach_int8(blocks)
        layer.attach_int4(Int4Groups((codes + 8).clamp(0, 15).to(torch.uint8), scales, torch.zeros_like(scales)))
        layers.append(layer)
    return layers


def _time(fn, layers, x, reps: int) -> float:
    for layer in layers[:4]:
        fn(layer, x)
    times = []
    for i in range(reps):
        layer = layers[i % len(layers)]
        start = time.perf_counter()
        fn(layer, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _dense(layer: Linear, x):
    if layer.prepacked is not None:
        return cpu_matmul.prepacked_linear(x, layer.prepacked)
    return cpu_matmul.linear(x, layer.weight)


def _int8(layer: Linear, x):
    return layer.int8.matmul(x).to(x.dtype)


def _int4(layer: Linear, x):
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer.int4_weight, 32, layer.int4_scales_zeros)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--shapes", choices=sorted(SHAPE_SETS), default="gemma3")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    print(f"threads {torch.get_num_threads()}; microseconds per call (median)")
    print(f"{'shape':>8} {'N':>5} {'K':>5} {'rows':>4} {'dense':>8} {'int8':>8} {'int4':>8}")
    for name, (n, k) in SHAPE_SETS[args.shapes].items():
        layers = _layers(n, k)
        for rows in args.rows:
            x = torch.randn(rows, k, dtype=torch.bfloat16)
            row = {"shape": name, "n": n, "k": k, "rows": rows}
            for label, fn in (("dense", _dense), ("int8", _int8), ("int4", _int4)):
                row[label] = _time(fn, layers, x, args.reps)
            results.append(row)
            print(f"{name:>8} {n:>5} {k:>5} {rows:>4} {row['dense']:8.1f} {row['int8']:8.1f} {row['int4']:8.1f}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
