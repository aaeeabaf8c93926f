"""Where a GPU step's time goes: torch.profiler tables for the engine's steps.

    python benchmarks/gpu_profile.py                       # SmolLM2 shape, CUDA
    python benchmarks/gpu_profile.py --shape llama-3.2-1b --rows 30
    python benchmarks/gpu_profile.py --device cpu --shape tiny   # smoke run

Runs gpu_engine.py's throughput workload (256 requests of 512 prompt / 256 output
tokens, random Llama-shaped weights) and profiles three of its steps: the first
(a prefill-only batch of max_num_batched_tokens prompt tokens), one mixing decodes
with prefill chunks, and one decode-only step at full batch. For each it prints the
step's wall time, its engine phases and the kernels by device time (host time on
the CPU), so that a change aimed at one of them can be predicted before it is made.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
from gpu_engine import FULL, SHAPES, SMOKE, make_engine, random_prompts, sync, write_checkpoint  # noqa: E402


def profiled_step(engine, device: torch.device, label: str, rows: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    timers = dict(engine.timers)
    before = engine.counters["prompt_tokens"]
    running = len(engine.scheduler.running)
    sync(device)
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        engine.step()
        sync(device)
        wall = time.perf_counter() - t
    phases = {k[:-2]: (engine.timers[k] - timers[k]) * 1e3 for k in timers}
    print(f"\n== {label}: {engine.counters['prompt_tokens'] - before} prompt tokens, {running} running before; "
          f"wall {wall * 1e3:.2f} ms (profiled); phases ms " + " ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    device = torch.device(args.device)
    work = FULL if device.type == "cuda" else SMOKE
    shape = SHAPES[args.shape]
    from inference.engine import SamplingParams

    with tempfile.TemporaryDirectory(prefix="gpu-profile-") as tmp:
        path = Path(tmp)
        write_checkpoint(shape, path, seed=0)
        esize = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
        kv_per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim * esize
        total = work.prompt_len + work.output_len
        engine = make_engine(path, device, args.dtype, work.requests,
                             int(work.requests * (total + 16) * kv_per_token / 2**20) + 64, total + 8)
        engine.generate(random_prompts(2, work.prompt_len, shape.vocab, 4),
                        SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
        sampling = SamplingParams(max_tokens=work.output_len, temperature=0.0, ignore_eos=True)
        for i, prompt in enumerate(random_prompts(work.requests, work.prompt_len, shape.vocab, 3)):
            engine.add_request(f"p{i}", prompt, sampling)
        profiled_step(engine, device, "first step (prefill only)", args.rows)
        engine.step()
        profiled_step(engine, device, "a mixed step (decodes + prefill chunks)", args.rows)
        while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens
                                              for s in engine.scheduler.running):
            engine.step()
        for _ in range(3):
            engine.step()
        profiled_step(engine, device, f"a decode-only step ({len(engine.scheduler.running)} sequences)", args.rows)


if __name__ == "__main__":
    main()
