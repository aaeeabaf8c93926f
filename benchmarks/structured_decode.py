"""What a grammar costs a decode: 64 concurrent requests with a json_schema on every one vs none, same run.

Issue 38's target: the grammar costs at most 10% of throughput. Both modes decode the same prompts for the
same number of tokens: unconstrained requests ignore EOS; constrained ones have a schema that cannot end
within --output-len tokens (an array of at least 50 records of one of ten typical schemas,
tests/engine/structured_schemas.py: BOUNDED), so every row walks keys, enums, numbers and strings for the
whole run. Each round runs the two modes back to back, after a warm-up of each (the grammars are compiled
and cached there: this measures decoding, not compiling: see benchmarks/grammar_compile.py).
Figures: output tokens per second overall and in decode-only steps, medians of --rounds, and the median of
the rounds' own ratios grammar / none (on a shared, noisy machine a round's two runs see the same load).

    python benchmarks/structured_decode.py                       # 64 x 64 tokens, 3 rounds
    python benchmarks/structured_decode.py --device cuda --dtype bfloat16 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _runtime import runtime_configure_from_env  # noqa: E402
from tests.engine.structured_schemas import BOUNDED, TYPICAL  # noqa: E402

MODEL = "smollm2-135m-instruct"


def record_schema(name: str) -> dict:
    """`name`'s records, at least 50 of them: no document ends within a few hundred tokens."""
    schema = dict(TYPICAL[name][0])
    defs = schema.pop("$defs", None)
    wrapped = {"type": "object", "additionalProperties": False, "required": ["records"],
               "properties": {"records": {"type": "array", "items": schema, "minItems": 50}}}
    return {**wrapped, "$defs": defs} if defs else wrapped


def run(engine, prompts, params) -> dict:
    """All requests at once (the concurrency is their number); wall time, tokens, decode-only rate."""
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", prompt, sp)
    before = dict(engine.timers)
    tokens = decode_tokens = 0
    decode_s = 0.0
    t0 = time.perf_counter()
    while engine.has_unfinished():
        sched = engine.scheduler
        decode_only = not sched.waiting and not engine.structured.waiting and all(
            s.num_tokens - s.num_computed_tokens <= 1 for s in sched.running)
        ts = time.perf_counter()
        outs = engine.step()
        n = sum(len(o.new_token_ids) for o in outs)
        tokens += n
        if decode_only:
            decode_s += time.perf_counter() - ts
            decode_tokens += n
        bad = [o for o in outs if o.finish_reason == "error"]
        assert not bad, bad[0].error
    wall = time.perf_counter() - t0
    timers = {k: round(engine.timers[k] - before[k], 3) for k in before}
    return {"tok_s": tokens / wall, "decode_tok_s": decode_tokens / decode_s if decode_s else None,
            "tokens": tokens, "wall_s": wall, "timers": timers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 on the CPU, bfloat16 on CUDA")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runtime_configure_from_env()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    from inference.engine import Engine, EngineConfig, SamplingParams
    from inference.engine.structured_spec import StructuredOutput

    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                 kv_cache_mb=args.kv_cache_mb, max_num_seqs=args.concurrency,
                                 max_num_batched_tokens=max(2048, args.concurrency * 32)))
    tok = engine.tokenizer
    names = [BOUNDED[i % len(BOUNDED)] for i in range(args.concurrency)]
    prompts = [tok.encode_chat([{"role": "user", "content": f"List {n.replace('_', ' ')} records as JSON."}])
               for n in names]
    modes = {
        "none": [SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True) for _ in names],
        "grammar": [SamplingParams(temperature=0.0, max_tokens=args.output_len, structured_output=StructuredOutput(
            "json_schema", record_schema(n), True)) for n in names],
    }
    for params in modes.values():  # warm-up: kernels, caches, the grammars compiled
        run(engine, prompts, [dataclasses.replace(p, max_tokens=4) for p in params])
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode, params in modes.items():
            results[mode].append(run(engine, prompts, params))
            assert results[mode][-1]["tokens"] == args.concurrency * args.output_len
    report(args, results, engine)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _median(rounds: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def report(args, results: dict, engine) -> None:
    summary = {mode: {"tok_s": _median(r, "tok_s"), "decode_tok_s": _median(r, "decode_tok_s"),
                      "rounds_tok_s": [round(x["tok_s"], 1) for x in r], "timers_last": r[-1]["timers"]}
               for mode, r in results.items()}
    pairs = list(zip(results["none"], results["grammar"]))
    ratio = statistics.median(g["tok_s"] / n["tok_s"] for n, g in pairs)
    decode_ratio = statistics.median(g["decode_tok_s"] / n["decode_tok_s"] for n, g in pairs)
    # the grammar's own host work (masks in sampling, matchers in take), from the step timers: steadier than the
    # throughput ratio on a machine whose load changes between runs
    extra = statistics.median(sum(g["timers"][k] - n["timers"][k] for k in ("sample_s", "take_s")) / g["wall_s"]
                              for n, g in pairs)
    out = {"model": args.model, "device": str(engine.device), "dtype": args.dtype, "concurrency": args.concurrency,
           "output_len": args.output_len, "rounds": args.rounds, "cores": os.cpu_count(),
           "modes": summary, "ratio": ratio, "decode_ratio": decode_ratio, "grammar_host_share": extra}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.model} on {engine.device} ({args.dtype}), {args.concurrency} concurrent x {args.output_len} tokens, "
          f"median of {args.rounds}")
    for mode, s in summary.items():
        print(f"  {mode:<8} {s['tok_s']:8.1f} tok/s overall ({s['rounds_tok_s']}), {s['decode_tok_s']:8.1f} tok/s in "
              f"decode-only steps; last round's step split {s['timers_last']}")
    print(f"  grammar / none, median of the rounds' ratios: {ratio:.3f} overall, {decode_ratio:.3f} in decode-only "
          f"steps (cost {1 - ratio:.1%}; target at most 10%); the grammar's host work (masks, matchers): "
          f"{extra:.1%} of the constrained runs' time")


if __name__ == "__main__":
    main()
