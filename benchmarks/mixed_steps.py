"""Mixed steps (decodes + a new prompt) with and without the decode/prefill attention split, on the CPU.

    .venv/bin/python benchmarks/mixed_steps.py                 # both parts, bfloat16, one torch thread
    .venv/bin/python benchmarks/mixed_steps.py --part steps --rounds 5 --json

A step that admits a prompt while others decode is a mixed step. The model runner lists its
one-token sequences first and the attention layers send them through the decode kernel (the
native C kernel here, Triton's on CUDA), the prompt rows through the prefill kernel. The peer,
in the same process on the same engine, is `ModelRunner.split_mixed = False`: every row of a
mixed step through the prefill kernel, the decode rows by the reference's gather-and-pad path
(what ran before). Rounds alternate the two.

Parts:
  steps     --decodes sequences decoding at --context tokens; each round times a decode-only
            step, then one step admitting a --prompt-len prompt (a mixed step), per mode.
  workload  the serving benchmark's workload through the engine alone (benchmarks/serving.py's
            prompts, chat template, output lengths and ramp; closed loop of --concurrency):
            output tok/s, decode-only and mixed step medians, how many steps were mixed. Each
            round starts with an empty prefix cache (the rounds reuse the prompts).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _runtime import runtime_configure_from_env  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from engine_offline import machine, random_prompts  # noqa: E402  (benchmarks/, this script's folder)
from serving import closed_loop, output_lengths, prompts_build  # noqa: E402

MODEL = "smollm2-135m-instruct"
MODES = {"split": True, "unsplit": False}
_IDS = itertools.count()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["steps", "workload", "both"], default="both")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=1, help="torch threads (the serving benchmark's engine uses 1)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per mode")
    p.add_argument("--decodes", type=int, default=32)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=150)
    p.add_argument("--steps-per-round", type=int, default=4, help="steps part: (decode, mixed) pairs per round")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=96, help="workload part: requests per round")
    p.add_argument("--prompt-words", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--jitter", type=float, default=0.25)
    p.add_argument("--ramp-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="last line: one JSON object")
    return p.parse_args(argv)


def make_engine(args):
    from inference.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=MODEL, device="cpu", dtype=args.dtype, kv_cache_mb=512,
                               max_num_seqs=max(64, args.decodes + 1, args.concurrency),
                               num_threads=args.threads))


def median_ms(values: list[float]) -> float | None:
    return round(1000 * statistics.median(values), 2) if values else None


def steps_part(engine, args, log) -> dict:
    """Decode-only vs mixed step times at a fixed batch, per mode."""
    from inference.engine import SamplingParams

    rng = random.Random(args.seed)
    vocab, special = engine.vocab_size, set(engine.tokenizer.all_special_ids)
    decoding = random_prompts(rng, args.decodes, args.context, args.context, vocab, special)
    admitted = random_prompts(rng, args.rounds * len(MODES) * args.steps_per_round, args.prompt_len,
                              args.prompt_len, vocab, special)
    long = SamplingParams(max_tokens=4096, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(decoding):
        engine.add_request(f"d{i}", prompt, long)
    while engine.scheduler.waiting:
        engine.step()
    times = {mode: {"decode": [], "mixed": []} for mode in MODES}
    one = SamplingParams(max_tokens=1, temperature=0.0)
    count = 0
    for r in range(args.rounds):
        for mode, split in MODES.items():
            engine.runner.split_mixed = split
            for _ in range(args.steps_per_round):
                t = time.perf_counter()
                engine.step()
                times[mode]["decode"].append(time.perf_counter() - t)
                engine.add_request(f"p{count}", admitted[count], one)
                count += 1
                t = time.perf_counter()
                engine.step()  # admits the prompt whole (it fits the token budget): one mixed step
                times[mode]["mixed"].append(time.perf_counter() - t)
            log(f"round {r} {mode}: decode {median_ms(times[mode]['decode'])} ms, "
                f"mixed {median_ms(times[mode]['mixed'])} ms (medians so far)")
    for i in range(args.decodes):
        engine.abort(f"d{i}")
    while engine.has_unfinished():
        engine.step()
    out = {mode: {kind: median_ms(v) for kind, v in d.items()} for mode, d in times.items()}
    out["mixed_speedup"] = round(out["unsplit"]["mixed"] / out["split"]["mixed"], 3)
    return out


def workload_round(engine, prompts, lengths, args) -> dict:
    """One closed loop of the serving benchmark's workload; step times split by kind."""
    from inference.engine import SamplingParams

    tokenizer = engine.tokenizer
    todo = [tokenizer.encode_chat(m) for m in prompts]
    engine.block_manager.reset_prefix_cache()  # every round starts cold, as a fresh server would (rounds reuse prompts)
    produced, next_index, decode_s, mixed_s = 0, 0, [], []

    def add() -> None:
        nonlocal next_index
        sampling = SamplingParams(max_tokens=lengths[next_index], temperature=0.8, ignore_eos=True,
                                  seed=next_index)
        engine.add_request(f"w{next(_IDS)}", todo[next_index], sampling)
        next_index += 1

    def step():
        prompt_before = engine.counters["prompt_tokens"]
        t = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - t
        (mixed_s if engine.counters["prompt_tokens"] > prompt_before else decode_s).append(elapsed)
        return outputs

    def on_outputs(outputs) -> None:
        nonlocal produced
        produced += sum(len(output.new_token_ids) for output in outputs)

    wall = closed_loop(engine, len(todo), args, add, on_outputs, step)
    return {"tok_s": produced / wall, "decode_steps": decode_s, "mixed_steps": mixed_s}


def workload_part(engine, args, log) -> dict:
    prompts = prompts_build(args.requests, args.prompt_words, args.seed)
    lengths = output_lengths(args)
    rounds = {mode: [] for mode in MODES}
    for split in MODES.values():  # warm-up, not counted: first-use costs of both paths
        engine.runner.split_mixed = split
        workload_round(engine, prompts[:4], lengths, argparse.Namespace(concurrency=4, ramp_s=0.0))
    for r in range(args.rounds):
        for mode, split in MODES.items():
            engine.runner.split_mixed = split
            result = workload_round(engine, prompts, lengths, args)
            rounds[mode].append(result)
            log(f"round {r} {mode}: {result['tok_s']:.1f} tok/s, {len(result['mixed_steps'])} mixed of "
                f"{len(result['mixed_steps']) + len(result['decode_steps'])} steps")
    out = {}
    for mode, results in rounds.items():
        out[mode] = {
            "tok_s_median": round(statistics.median(r["tok_s"] for r in results), 2),
            "tok_s_rounds": [round(r["tok_s"], 2) for r in results],
            "decode_step_ms": median_ms([x for r in results for x in r["decode_steps"]]),
            "mixed_step_ms": median_ms([x for r in results for x in r["mixed_steps"]]),
            "mixed_steps": sum(len(r["mixed_steps"]) for r in results),
            "steps": sum(len(r["mixed_steps"]) + len(r["decode_steps"]) for r in results),
        }
    out["tok_s_ratio"] = round(out["split"]["tok_s_median"] / out["unsplit"]["tok_s_median"], 3)
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    runtime_configure_from_env()
    args.requests = max(args.requests, 1)

    def log(msg):
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    torch.manual_seed(args.seed)
    engine = make_engine(args)
    report = {
        "config": vars(args),
        "machine": {**machine(), "python": platform.python_version()},
    }
    if args.part in ("steps", "both"):
        report["steps"] = steps_part(engine, args, log)
        log(json.dumps(report["steps"]))
    if args.part in ("workload", "both"):
        report["workload"] = workload_part(engine, args, log)
        log(json.dumps(report["workload"]))
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
