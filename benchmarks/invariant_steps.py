"""Batch-invariant mode's cost per engine step, both engines in one process, rounds interleaved.

    OMP_NUM_THREADS=1 python benchmarks/invariant_steps.py [--rounds 4] [--threads 1] [--single-prompt-len 32] [--json]

benchmarks/batch_invariant_ab.py compares whole runs in fresh processes, and its single-stream figure is
1 / mean inter-token latency over 16 tokens, which one hiccup of a shared host moves by 20%. Here two
engines over the same loaded SmolLM2 (bf16), one with batch_invariant False and one True, take turns (the
order alternating each round): a single stream (a 32-token prompt by default, 64 greedy tokens) and 64 sequences
decoding together (prompts of 32-63 tokens, 24 tokens each). Each figure is the median step time of a
round's decode-only steps (the single stream's first two left out; the 64-sequence figure only over steps
with all 64 decoding); the summary takes the median over rounds and the ratio default / invariant (speed
of the mode relative to the default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _decode_steps(engine, prompts: list[list[int]], sampling, tag: str, full: int) -> list[float]:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, sampling)
    times = []
    while engine.has_unfinished():
        sched = engine.scheduler
        decoding = (not sched.waiting and len(sched.running) == full
                    and all(s.num_tokens - s.num_computed_tokens == 1 for s in sched.running))
        start = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--single-prompt-len", type=int, default=32, help="the single stream's prompt tokens")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    from engine_offline import MODEL, model_gguf
    from inference.engine import Engine, EngineConfig, SamplingParams
    from inference.engine.loader import load_model

    torch.set_num_threads(args.threads)
    model_gguf(MODEL)
    loaded = load_model(MODEL, dtype=torch.bfloat16, device=torch.device("cpu"))
    engines = {mode: Engine(EngineConfig(model=MODEL, dtype="bfloat16", max_num_seqs=64, kv_cache_mb=512,
                                         batch_invariant=mode), loaded=loaded) for mode in (False, True)}
    single = [[1000 + i % 5000 for i in range(args.single_prompt_len)]]
    batch = [[1000 + (i * 7 + j) % 5000 for j in range(32 + i % 32)] for i in range(64)]
    figures: dict[str, dict[bool, list[float]]] = {"single_ms": {False: [], True: []},
                                                   "decode64_ms": {False: [], True: []}}
    for rnd in range(args.rounds):
        for mode in ((False, True) if rnd % 2 == 0 else (True, False)):
            engine = engines[mode]
            steps = _decode_steps(engine, single, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True),
                                  f"s{rnd}", 1)[2:]
            figures["single_ms"][mode].append(statistics.median(steps) * 1e3)
            steps = _decode_steps(engine, batch, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
                                  f"b{rnd}", 64)
            figures["decode64_ms"][mode].append(statistics.median(steps) * 1e3)
    summary = {"threads": args.threads, "rounds": args.rounds,
               "fingerprints": {str(mode): engines[mode].system_fingerprint for mode in engines}}
    for name, by_mode in figures.items():
        off, on = statistics.median(by_mode[False]), statistics.median(by_mode[True])
        summary[name] = {"default": by_mode[False], "invariant": by_mode[True], "default_median": off,
                         "invariant_median": on, "speed_ratio": off / on}
        if not args.json:
            print(f"{name}: default {off:.2f} ms, invariant {on:.2f} ms (per round "
                  f"{[round(v, 2) for v in by_mode[False]]} / {[round(v, 2) for v in by_mode[True]]}); "
                  f"invariant speed {off / on:.3f}x the default")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
