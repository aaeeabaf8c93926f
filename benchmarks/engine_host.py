"""The engine's host work per decode step at large batch, on any machine (no GPU needed).

On a GPU the decode forward of a small model at batch 256 takes a few ms, and
the Python around it (scheduling, input preparation, turning tokens into text
and outputs) decides whether the step is GPU-bound (BENCHMARKS.md, GPU). This
runs real `Engine.step()`s over B sequences with C-token contexts on a
Llama-shaped random-weight model made tiny (hidden 64, 2 layers) so the model
is cheap, with a byte-level BPE tokenizer like the real models'
(`gpu_engine.write_checkpoint`), and reports the engine's own phase timers per
step: schedule, prepare, take (appending the sampled tokens, stop-token and
length checks) and output (detokenizing, stop strings and RequestOutputs).
With `--mode async_scheduling` (the CUDA default since 2026-11-26: `EngineConfig.async_scheduling`) all of them
run while the GPU computes a step, so the GPU waits only when their sum outlasts its
forward; with `--mode async_output` (the CUDA default) only output does, and
schedule + prepare + take sit between two forwards.

Peers in the same run, interleaved: the two detokenizers.

    python benchmarks/engine_host.py                      # batch 256, context 1024
    python benchmarks/engine_host.py --batch 64 --context 512 --rounds 5 --json
    python benchmarks/engine_host.py --mode async_output   # the step order before async scheduling
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _compare import medians_against  # noqa: E402
from _runtime import runtime_configure_from_env  # noqa: E402

DETOKENIZERS = ("byte-level", "window")
VOCAB = 4096  # the tiny model's vocabulary (gpu_engine's "tiny" shape otherwise)


def run_steps(path: Path, args, detokenizer: str) -> dict[str, float]:
    """Median ms per step of each phase over --steps decode steps."""
    import torch

    from inference.engine import Engine, EngineConfig, SamplingParams, engine as engine_module
    from inference.engine.detokenizer import IncrementalDetokenizer, detokenizer_for
    from gpu_engine import random_prompts

    engine_module.detokenizer_for = detokenizer_for if detokenizer == "byte-level" else IncrementalDetokenizer
    torch.set_num_threads(1)
    max_len = args.context + args.steps + 160
    engine = Engine(EngineConfig(model=str(path), device="cpu", dtype="float32",
                                 kv_cache_mb=int(args.batch * (max_len + 16) * 256 / 2**20) + 64,
                                 block_size=16, max_num_seqs=args.batch, max_num_batched_tokens=max(8192, args.batch),
                                 enable_prefix_caching=False, max_model_len=max_len, async_output=True,
                                 async_scheduling=args.mode == "async_scheduling"))
    sampling = SamplingParams(max_tokens=args.steps + 140, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(args.batch, args.context, args.vocab, 2)):
        engine.add_request(f"h{i}", prompt, sampling)
    started: set[str] = set()
    while len(started) < args.batch:
        started.update(o.request_id for o in engine.step() if o.new_token_ids)
    engine.step()
    phases: dict[str, list[float]] = {"step": [], "schedule": [], "prepare": [], "take": [], "output": []}
    for _ in range(args.steps):
        before = dict(engine.timers)
        t = time.perf_counter()
        outputs = engine.step()
        phases["step"].append((time.perf_counter() - t) * 1e3)
        assert len(outputs) == args.batch, len(outputs)
        for name in ("schedule", "prepare", "take", "output"):
            phases[name].append((engine.timers[f"{name}_s"] - before[f"{name}_s"]) * 1e3)
    engine_module.detokenizer_for = detokenizer_for
    return {name: statistics.median(values) for name, values in phases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each detokenizer, interleaved")
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--mode", choices=["async_scheduling", "async_output"], default="async_scheduling",
                        help="the engine's step order (async_scheduling: the CUDA default; async_output: the one before it)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runtime_configure_from_env()

    from gpu_engine import SHAPES, write_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        write_checkpoint(dataclasses.replace(SHAPES["tiny"], vocab=args.vocab), path, 0)
        rounds = {name: [] for name in DETOKENIZERS}
        for _ in range(args.rounds):
            for name in DETOKENIZERS:
                rounds[name].append(run_steps(path, args, name))
    report = {"batch": args.batch, "context": args.context, "steps": args.steps, "rounds": args.rounds,
              "mode": args.mode, "ms_per_step": {}}
    for phase in ("output", "schedule", "prepare", "take", "step"):
        print(f"-- {phase} ms per step (median of {args.rounds} rounds of {args.steps} steps' medians)")
        samples = {f"{name} detokenizer": [r[phase] for r in rounds[name]] for name in DETOKENIZERS}
        report["ms_per_step"][phase] = medians_against(samples, "window detokenizer", unit="ms")[0]
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
