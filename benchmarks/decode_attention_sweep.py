"""Tuning sweep of the Triton paged decode attention kernel on a CUDA device.

    python benchmarks/decode_attention_sweep.py            # both model shapes, batch 1/16/64/256, ctx 1024
    python benchmarks/decode_attention_sweep.py --json     # last line: one JSON object

For each case (model shape, batch, context) it times every launch configuration
(KV splits x tokens per tile x warps x pipeline stages) with CUDA-graph replays
(``triton.testing.do_bench_cudagraph``, so the Python launcher's own time is
left out), over several input sets in turn so that the K/V come from device
memory rather than L2. Each configuration's output is first checked against the
default configuration's. Reports the best configurations per case as achieved
bandwidth over the measured copy bandwidth, next to the default heuristic's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from gpu_engine import copy_bandwidth  # noqa: E402  (benchmarks/, this script's folder)
from kernels import paged_decode_attention as pda  # noqa: E402
from tests.kernels.paged_cases import make_paged_case  # noqa: E402

SHAPES = {"smollm2-135m": (9, 3, 64), "llama-3.2-1b": (32, 8, 64)}


def main() -> None:
    from triton.testing import do_bench_cudagraph

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--block-n", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--sets", type=int, default=4, help="input sets rotated per timing (defeats L2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_attention_sweep.py needs a CUDA device")
    dtype = torch.bfloat16
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bandwidth:.0f} GB/s; bf16")
    results = []
    for model, batch, ctx in itertools.product(SHAPES, args.batches, args.contexts):
        hq, hkv, dim = SHAPES[model]
        cases = [make_paged_case([1] * batch, [ctx] * batch, hq, hkv, dim, 16, dtype, "cuda", seed=s)
                 for s in range(args.sets)]
        gbytes = args.sets * (2 * batch * ctx * hkv * dim + 2 * batch * hq * dim) * 2 / 1e9
        arg_sets = [(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale) for c in cases]
        expected = pda.paged_decode_attention(*arg_sets[0])
        default_splits = pda.choose_num_splits(batch, hkv, cases[0].block_tables.shape[1], 16, torch.device("cuda"))
        configs = [(None, 64, 4, None)] + list(itertools.product(args.splits, args.block_n, args.warps, args.stages))
        rows = []
        for splits, block_n, warps, stages in configs:
            if splits is not None and splits > max(1, ctx // 64):
                continue
            kw = dict(num_splits=splits, block_n=block_n, num_warps=warps, num_stages=stages)
            try:
                got = pda.paged_decode_attention(*arg_sets[0], **kw)
            except Exception as exc:  # e.g. out of shared memory for a config
                print(f"  {model} B={batch} ctx={ctx} {kw}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            err = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
            if not err < 1e-2:
                print(f"  {model} B={batch} ctx={ctx} {kw}: WRONG, relative error {err:.3g}")
                continue

            def run(kw=kw):
                for a in arg_sets:
                    pda.paged_decode_attention(*a, **kw)

            ms = do_bench_cudagraph(run, rep=50, return_mode="median")
            rows.append({"splits": splits or default_splits, "block_n": block_n, "warps": warps,
                         "stages": stages, "default": splits is None, "us": ms * 1e3 / args.sets,
                         "pct_copy": 100 * gbytes / (ms / 1e3) / bandwidth})
        rows.sort(key=lambda r: r["us"])
        default = next(r for r in rows if r["default"])
        print(f"{model} B={batch} ctx={ctx}: default (splits {default['splits']}, 64, 4 warps) "
              f"{default['us']:.1f} us = {default['pct_copy']:.0f}% of copy")
        for r in rows[:4]:
            print(f"    splits {r['splits']:3d} block_n {r['block_n']:4d} warps {r['warps']} stages {r['stages']}: "
                  f"{r['us']:.1f} us = {r['pct_copy']:.0f}%")
        results.append({"model": model, "batch": batch, "context": ctx, "default": default, "best": rows[:8]})
    if args.json:
        print(json.dumps({"device": torch.cuda.get_device_name(), "copy_gb_s": bandwidth, "cases": results}))


if __name__ == "__main__":
    main()
