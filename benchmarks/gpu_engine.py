"""GPU benchmark of the engine on Llama-shaped models with random weights.

    python benchmarks/gpu_engine.py                       # CUDA: both shapes, full workload
    python benchmarks/gpu_engine.py --shapes smollm2-135m --quick
    python benchmarks/gpu_engine.py --device cpu          # tiny-shape smoke run of the script itself
    python benchmarks/gpu_engine.py --json                # last line: one JSON object
    python benchmarks/gpu_engine.py --no-async-scheduling # deferred outputs only: the peer of the CUDA default
    python benchmarks/gpu_engine.py --no-split-mixed      # the peer of the mixed-step attention split
    python benchmarks/gpu_engine.py --no-prefill-graphs --parts throughput prefill --no-peer
                                                          # the peer of the piecewise prefill graphs
    python benchmarks/gpu_engine.py --batch-invariant --parts throughput --no-peer   # the mode's cost

For each shape it writes a random-weight checkpoint (transformers
LlamaForCausalLM, safetensors, plus a byte-level BPE tokenizer.json like the
real models' so the engine detokenizes as it would for them), then:
  1. checks the engine's greedy tokens against transformers' greedy generate on
     the same weights (float32 must match; bfloat16, engine and transformers
     alike, reported as agreement with transformers float32);
  2. times engine decode steps at batch 1, 16, 64, 256 with 1k-token contexts
     (20 consecutive steps over the wall clock, their host-side phases, and the
     decode forward's CUDA-graph replay alone);
  3. measures output tok/s for 256 requests of 512 prompt / 256 output tokens,
     and the same workload through transformers ``generate``;
  4. computes each decode step's memory roofline: (weight bytes + KV bytes
     read) / measured device-to-device copy bandwidth;
  5. measures prompt tokens/s: the same 256 prompts with one output token each,
     and transformers' forward over them (64 prompts per call, logits of the
     last position only).
``--parts`` picks among check, decode, throughput, prefill (default: all;
``--skip-check`` drops the first); ``--no-peer`` skips transformers in 3 and 5.
The Llama-3.2-1B shape uses plain RoPE (the engine's loader rejects llama3 rope
scaling); that changes no byte or FLOP count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _runtime import runtime_configure_from_env  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float


SHAPES = {
    "smollm2-135m": Shape(49152, 576, 1536, 30, 9, 3, 64, 100000.0),
    "llama-3.2-1b": Shape(128256, 2048, 8192, 16, 32, 8, 64, 500000.0),
    "tiny": Shape(512, 64, 128, 2, 4, 2, 16, 10000.0),  # --device cpu smoke run
}


@dataclass(frozen=True)
class Workload:
    batches: tuple[int, ...]
    context: int
    timed_steps: int
    requests: int
    prompt_len: int
    output_len: int
    check_prompts: int
    check_tokens: int


FULL = Workload((1, 16, 64, 256), 1024, 20, 256, 512, 256, 8, 32)
QUICK = Workload((1, 64), 1024, 10, 64, 512, 64, 4, 16)
SMOKE = Workload((1, 4), 64, 5, 8, 32, 16, 3, 8)


def write_checkpoint(shape: Shape, path: Path, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.inter,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, rope_theta=shape.rope_theta,
        max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=1,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the default init: peakier logits, stabler argmax
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.05 if "embed" not in name else 1.0)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(shape, path)


def write_tokenizer(shape: Shape, path: Path) -> None:
    """tokenizer.json and tokenizer_config.json: byte-level BPE over ``shape.vocab`` ids, bos 0 and eos 1."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(byte_level_vocab(shape.vocab), merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|bos|>", "<|eos|>")])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>", "eos_token": "<|eos|>"}))


def byte_level_vocab(size: int) -> dict[str, int]:
    """A byte-level BPE vocabulary of `size` (GPT-2 style, as SmolLM2's and Llama 3's are, so the
    engine detokenizes as it would for them): ids 0 and 1 the special bos/eos, then the 256 single
    bytes, then distinct 2- and 3-byte tokens."""
    from itertools import product

    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|bos|>": 0, "<|eos|>": 1}
    pieces = (("".join(p) for n in (1, 2, 3) for p in product(alphabet, repeat=n)))
    for piece in pieces:
        if len(vocab) == size:
            break
        vocab[piece] = len(vocab)
    return vocab


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    n = (512 << 20) // 4 if device.type == "cuda" else (64 << 20) // 4
    src = torch.empty(n, device=device).normal_()
    dst = torch.empty_like(src)
    if device.type == "cuda":
        from triton.testing import do_bench

        ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    else:
        samples = []
        for _ in range(10):
            t = time.perf_counter()
            dst.copy_(src)
            samples.append((time.perf_counter() - t) * 1e3)
        ms = statistics.median(samples)
    return 2 * n * 4 / (ms / 1e3) / 1e9


ASYNC_OUTPUT: bool | None = None  # --sync-output sets False (EngineConfig's default: on for CUDA)
ASYNC_SCHEDULING: bool | None = None  # --[no-]async-scheduling (EngineConfig's default: on for CUDA)
SPLIT_MIXED = True  # --no-split-mixed: a mixed step's decodes go through the prefill kernel too (the peer)
PREFILL_GRAPHS = True  # --no-prefill-graphs: prompt and mixed steps eager (the peer of the piecewise graphs)
BATCH_INVARIANT = False  # --batch-invariant


def make_engine(path: Path, device: torch.device, dtype: str, max_seqs: int, kv_mb: int, max_len: int,
                loaded=None, **extra):
    from inference.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(
        model=str(path), device=str(device), dtype=dtype, kv_cache_mb=kv_mb, block_size=16,
        max_num_seqs=max_seqs, max_num_batched_tokens=max(8192, max_seqs), enable_prefix_caching=False,
        max_model_len=max_len, async_output=ASYNC_OUTPUT, async_scheduling=ASYNC_SCHEDULING,
        prefill_graphs=PREFILL_GRAPHS, batch_invariant=BATCH_INVARIANT, **extra,
    ), loaded=loaded)
    engine.runner.split_mixed = SPLIT_MIXED
    return engine


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=gen).tolist()


def check_greedy(path: Path, shape: Shape, device: torch.device, work: Workload) -> dict:
    """Engine greedy tokens vs transformers greedy generate on the same weights.

    float32: the engine must match transformers float32 token for token. bfloat16: both are compared
    with transformers float32 (tokens before the first divergence), so transformers' own bf16 drift on
    these random weights is the yardstick for the engine's."""
    from transformers import LlamaForCausalLM

    from inference.engine import SamplingParams

    prompts = [p[: 7 + 13 * i] for i, p in enumerate(random_prompts(work.check_prompts, 200, shape.vocab, 1))]

    def hf_greedy(dtype: str) -> list[list[int]]:
        hf = LlamaForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
        out_tokens = []
        with torch.no_grad():
            for prompt in prompts:
                ids = torch.tensor([prompt], device=device)
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=work.check_tokens,
                                  min_new_tokens=work.check_tokens, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)
                out_tokens.append(out[0, len(prompt):].tolist())
        del hf
        return out_tokens

    def engine_greedy(dtype: str) -> list[list[int]]:
        engine = make_engine(path, device, dtype, 16, 256, 1024)
        sampling = SamplingParams(max_tokens=work.check_tokens, temperature=0.0, ignore_eos=True)
        got = [o.new_token_ids for o in engine.generate(prompts, sampling)]
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return got

    def agreement(got: list[list[int]], ref: list[list[int]]) -> dict:
        agree = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(got, ref)]
        return {"identical_sequences": sum(a == b for a, b in zip(got, ref)), "of": len(prompts),
                "mean_tokens_before_divergence": statistics.mean(agree)}

    reference = hf_greedy("float32")
    return {
        "float32": agreement(engine_greedy("float32"), reference),
        "bfloat16": agreement(engine_greedy("bfloat16"), reference),
        "transformers_bfloat16": agreement(hf_greedy("bfloat16"), reference),
    }


def weight_bytes_of(shape: Shape, esize: float, linear_esize: float | None = None,
                    head_esize: float | None = None) -> float:
    """Bytes of every weight a decode step reads: the model's ``esize`` bytes per value, except the decoder's
    linear layers at ``linear_esize`` and the LM head (the tied embedding) at ``head_esize`` where given (fp8)."""
    linear = shape.layers * (shape.hidden * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
                             + shape.heads * shape.head_dim * shape.hidden + 3 * shape.hidden * shape.inter)
    return (linear * (linear_esize or esize) + shape.vocab * shape.hidden * (head_esize or esize)
            + (shape.layers * 2 + 1) * shape.hidden * esize)


def decode_step_times(path: Path, shape: Shape, device: torch.device, dtype: str, work: Workload,
                      bandwidth: float, loaded=None, weight_bytes: float | None = None, **extra) -> list[dict]:
    """``loaded``/``extra``: passed to make_engine (gpu_fp8.py: a model built in memory, fp8 options);
    ``weight_bytes``: the step's weight bytes for the roofline (default: every weight in ``dtype``)."""
    from inference.engine import SamplingParams

    esize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    if weight_bytes is None:
        weight_bytes = weight_bytes_of(shape, esize)
    kv_per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim * esize
    rows = []
    for batch in work.batches:
        # sequences prefilled in the first steps keep decoding while the rest prefill: room for those tokens
        prefill_steps = -(-batch * work.context // max(8192, batch)) + 1
        new_tokens = prefill_steps + work.timed_steps + 4
        max_len = work.context + new_tokens + 8
        kv_mb = int(batch * (max_len + 16) * kv_per_token / 2**20) + 64
        engine = make_engine(path, device, dtype, batch, kv_mb, max_len, loaded=loaded, **extra)
        sampling = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        for i, prompt in enumerate(random_prompts(batch, work.context, shape.vocab, 2)):
            engine.add_request(f"d{i}", prompt, sampling)
        started = set()
        while len(started) < batch:  # prefill everything (the first token of each comes with it)
            started.update(o.request_id for o in engine.step() if o.new_token_ids)
        engine.step()  # one untimed decode step (graphs are captured at start-up; this warms the rest)
        engine.step()
        # consecutive steps, one sync at each end: with async scheduling a step's host work overlaps the
        # forward of the step before it, which a sync around every step would undo
        engine.timers = dict.fromkeys(engine.timers, 0.0)
        sync(device)
        t = time.perf_counter()
        for _ in range(work.timed_steps):
            outs = engine.step()
            assert len(outs) == batch, f"expected a decode step over {batch} sequences, got {len(outs)}"
        sync(device)
        step_s = (time.perf_counter() - t) / work.timed_steps
        graph_ms = None
        runner = engine.runner.graph_runner
        if runner is not None and runner.padded_size(batch) in runner.graphs:
            # the decode forward alone, on the GPU: a replay of the step's graph (re-writes the same K/V)
            from triton.testing import do_bench

            graph_ms = do_bench(runner.graphs[runner.padded_size(batch)].replay, return_mode="median")
        ctx = work.context + prefill_steps + work.timed_steps // 2
        roofline_s = (weight_bytes + batch * ctx * kv_per_token) / (bandwidth * 1e9)
        # host-only phases (scheduling, input preparation, detokenizing/stop checks/outputs); the model and
        # sampler phases include waiting for the GPU (the sampler's token copy is the step's one sync)
        phases = {k: v * 1e3 / work.timed_steps for k, v in engine.timers.items()}
        host_ms = phases["schedule_s"] + phases["prepare_s"] + phases["take_s"] + phases["output_s"]
        rows.append({"batch": batch, "context": work.context, "step_ms": step_s * 1e3,
                     "tok_s": batch / step_s, "roofline_ms": roofline_s * 1e3,
                     "x_roofline": step_s / roofline_s, "forward_graph_ms": graph_ms, "phases_ms": phases,
                     "host_overhead": host_ms / (sum(phases.values()) or 1.0)})
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def run_timed_steps(engine, prompts: list[list[int]], sampling, prefix: str = "t") -> tuple[list[tuple[float, int]], int]:
    """Run the prompts to completion; -> ([(wall s, prompt tokens computed) per step], output tokens).

    Steps that compute prompt tokens (prefill chunks, with the decodes sharing their batch) and
    decode-only steps are told apart by the engine's prompt-token counter."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{prefix}{i}", prompt, sampling)
    steps, produced = [], 0
    while engine.has_unfinished():
        before = engine.counters["prompt_tokens"]
        t = time.perf_counter()
        outs = engine.step()
        steps.append((time.perf_counter() - t, engine.counters["prompt_tokens"] - before))
        produced += sum(len(o.new_token_ids) for o in outs)
    return steps, produced


def step_split(steps: list[tuple[float, int]]) -> dict:
    prefill = [s for s, n in steps if n]
    decode = [s for s, n in steps if not n]
    return {"prefill_steps": len(prefill), "prefill_s": sum(prefill),
            "decode_steps": len(decode), "decode_s": sum(decode),
            "decode_step_ms_median": statistics.median(decode) * 1e3 if decode else None}


def throughput(path: Path, shape: Shape, device: torch.device, dtype: str, work: Workload,
               peer: bool = True) -> dict:
    from transformers import LlamaForCausalLM

    from inference.engine import SamplingParams

    prompts = random_prompts(work.requests, work.prompt_len, shape.vocab, 3)
    kv_per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    total_len = work.prompt_len + work.output_len
    kv_mb = int(work.requests * (total_len + 16) * kv_per_token / 2**20) + 64
    t = time.perf_counter()
    engine = make_engine(path, device, dtype, work.requests, kv_mb, total_len + 8)
    startup_s = time.perf_counter() - t  # loading, KV allocation and every graph capture
    sampling = SamplingParams(max_tokens=work.output_len, temperature=0.0, ignore_eos=True)
    # warm-up: the whole workload once, untimed, so that every kernel variant it takes (prefill tile sizes,
    # split and unsplit mixed steps, decode batch sizes) is compiled before the clock starts (on 2026-11-27 a
    # run after a 2-prompt warm-up on a fresh machine spent 1.5 s of its 2.7 s compiling Triton kernels)
    run_timed_steps(engine, prompts, sampling, prefix="w")
    sync(device)
    t = time.perf_counter()
    steps, produced = run_timed_steps(engine, prompts, sampling)
    sync(device)
    engine_s = time.perf_counter() - t
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result = {"requests": work.requests, "prompt_len": work.prompt_len, "output_len": work.output_len,
              "engine_tok_s": produced / engine_s, "engine_s": engine_s, "engine_startup_s": startup_s,
              **step_split(steps)}
    if not peer:
        return result

    hf = LlamaForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    ids = torch.tensor(prompts, device=device)
    chunk = work.requests
    with torch.no_grad():
        hf.generate(ids[:2], attention_mask=torch.ones_like(ids[:2]), max_new_tokens=4, do_sample=False,
                    pad_token_id=0)
        sync(device)
        t = time.perf_counter()
        hf_tokens = 0
        for start in range(0, work.requests, chunk):
            part = ids[start:start + chunk]
            out = hf.generate(part, attention_mask=torch.ones_like(part), max_new_tokens=work.output_len,
                              min_new_tokens=work.output_len, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
            hf_tokens += (out.shape[1] - part.shape[1]) * part.shape[0]
        sync(device)
        hf_s = time.perf_counter() - t
    del hf
    return {**result, "transformers_tok_s": hf_tokens / hf_s, "transformers_s": hf_s,
            "speedup": (produced / engine_s) / (hf_tokens / hf_s)}


def prefill_rate(path: Path, shape: Shape, device: torch.device, dtype: str, work: Workload,
                 peer: bool = True) -> dict:
    """Prompt tokens/s: ``work.requests`` prompts of ``work.prompt_len`` tokens, one output token each, through
    the engine (steps of up to 8192 tokens); and transformers' forward over the same prompts, 64 per call,
    computing the last position's logits only."""
    from transformers import LlamaForCausalLM

    from inference.engine import SamplingParams

    prompts = random_prompts(work.requests, work.prompt_len, shape.vocab, 5)
    kv_per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    kv_mb = int(work.requests * (work.prompt_len + 32) * kv_per_token / 2**20) + 64
    engine = make_engine(path, device, dtype, work.requests, kv_mb, work.prompt_len + 16)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    run_timed_steps(engine, prompts, one, prefix="w")  # warm-up: every kernel variant compiled (as throughput's)
    sync(device)
    t = time.perf_counter()
    steps, _ = run_timed_steps(engine, prompts, one)
    sync(device)
    engine_s = time.perf_counter() - t
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    tokens = work.requests * work.prompt_len
    result = {"prompts": work.requests, "prompt_len": work.prompt_len, "engine_prompt_tok_s": tokens / engine_s,
              "engine_s": engine_s, "steps": len(steps)}
    if not peer:
        return result
    hf = LlamaForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    ids = torch.tensor(prompts, device=device)
    per_call = min(64, work.requests)
    with torch.no_grad():
        hf(ids[:2], attention_mask=torch.ones_like(ids[:2]), logits_to_keep=1)  # warm-up
        sync(device)
        t = time.perf_counter()
        for start in range(0, work.requests, per_call):
            part = ids[start:start + per_call]
            hf(part, attention_mask=torch.ones_like(part), logits_to_keep=1)
        sync(device)
        hf_s = time.perf_counter() - t
    del hf
    return {**result, "transformers_prompt_tok_s": tokens / hf_s, "transformers_s": hf_s,
            "speedup": hf_s / engine_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--shapes", nargs="+", default=None, choices=sorted(SHAPES))
    parser.add_argument("--quick", action="store_true", help="smaller workload")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--sync-output", action="store_true",
                        help="build each step's outputs before the next step (no overlap with the GPU)")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                        help="schedule, prepare and launch each step before the previous one's tokens are read "
                             "back (default: the engine's, on for CUDA; off: after them, outputs still deferred "
                             "unless --sync-output)")
    parser.add_argument("--no-split-mixed", action="store_true",
                        help="mixed steps send their decode rows through the prefill kernel (the split's peer)")
    parser.add_argument("--no-prefill-graphs", action="store_true",
                        help="prompt and mixed steps run eagerly (the piecewise graphs' peer)")
    parser.add_argument("--batch-invariant", action="store_true", help="the engine in batch-invariant mode")
    parser.add_argument("--parts", nargs="+", default=["check", "decode", "throughput", "prefill"],
                        choices=["check", "decode", "throughput", "prefill"])
    parser.add_argument("--batches", nargs="+", type=int, default=None,
                        help="decode-step batch sizes (default: 1 16 64 256 on CUDA)")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers in the throughput and prefill parts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runtime_configure_from_env()
    global ASYNC_OUTPUT, ASYNC_SCHEDULING, SPLIT_MIXED, PREFILL_GRAPHS, BATCH_INVARIANT
    SPLIT_MIXED = not args.no_split_mixed
    PREFILL_GRAPHS = not args.no_prefill_graphs
    BATCH_INVARIANT = args.batch_invariant
    if args.sync_output:
        ASYNC_OUTPUT = False
    from inference.engine.config import check_step_order

    try:
        check_step_order(ASYNC_OUTPUT, args.async_scheduling)
    except ValueError as exc:
        parser.error(str(exc))
    ASYNC_SCHEDULING = args.async_scheduling
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("gpu_engine.py needs a CUDA device (torch.cuda.is_available() is False). "
                     "Use --device cpu for a tiny-shape smoke run of the script.")
        work = QUICK if args.quick else FULL
        if args.batches:
            work = replace(work, batches=tuple(args.batches))
        shapes = args.shapes or ["smollm2-135m", "llama-3.2-1b"]
        name = torch.cuda.get_device_name(device)
    else:
        work, shapes, name = SMOKE, args.shapes or ["tiny"], f"CPU ({torch.get_num_threads()} threads), smoke run"
    bandwidth = copy_bandwidth(device)
    from inference.engine.config import resolve_step_order

    deferred, ahead = resolve_step_order(device.type, ASYNC_OUTPUT, args.async_scheduling)
    mode = ("async scheduling (next step launched before this one's tokens are read)" if ahead
            else "synchronous" if not deferred
            else "deferred outputs (async_output)")
    if not SPLIT_MIXED:
        mode += "; mixed steps unsplit"
    if not PREFILL_GRAPHS:
        mode += "; prompt steps eager (no piecewise graphs)"
    if BATCH_INVARIANT:
        mode += "; batch-invariant"
    print(f"device: {name}; copy bandwidth {bandwidth:.1f} GB/s; dtype {args.dtype}; steps: {mode}")
    report = {"device": name, "dtype": args.dtype, "copy_gb_s": bandwidth, "mode": mode, "shapes": {}}
    for shape_name in shapes:
        shape = SHAPES[shape_name]
        with tempfile.TemporaryDirectory(prefix=f"gpu-engine-{shape_name}-") as tmp:
            path = Path(tmp)
            write_checkpoint(shape, path, seed=0)
            entry = {}
            if not args.skip_check and "check" in args.parts:
                entry["greedy_check"] = check_greedy(path, shape, device, work)
                for who, res in entry["greedy_check"].items():
                    label = who if who.startswith("transformers") else f"engine {who}"
                    print(f"[{shape_name}] greedy, {label} vs transformers float32: {res['identical_sequences']}/"
                          f"{res['of']} identical, {res['mean_tokens_before_divergence']:.1f} tokens agree on average")
            if "decode" in args.parts:
                entry["decode"] = decode_step_times(path, shape, device, args.dtype, work, bandwidth)
                print_decode(shape_name, entry["decode"])
            if "throughput" in args.parts:
                entry["throughput"] = t = throughput(path, shape, device, args.dtype, work, peer=not args.no_peer)
                versus = (f", transformers generate {t['transformers_tok_s']:.0f} tok/s ({t['speedup']:.1f}x)"
                          if "speedup" in t else "")
                print(f"[{shape_name}] {t['requests']}x({t['prompt_len']} in / {t['output_len']} out): engine "
                      f"{t['engine_tok_s']:.0f} tok/s{versus}; engine: {t['prefill_steps']} steps with prompt "
                      f"tokens {t['prefill_s']:.3f} s, {t['decode_steps']} decode-only steps {t['decode_s']:.3f} s "
                      f"(median {t['decode_step_ms_median'] or float('nan'):.3f} ms); start-up "
                      f"{t['engine_startup_s']:.1f} s")
            if "prefill" in args.parts:
                entry["prefill"] = p = prefill_rate(path, shape, device, args.dtype, work, peer=not args.no_peer)
                versus = (f", transformers forward {p['transformers_prompt_tok_s']:.0f} ({p['speedup']:.1f}x)"
                          if "speedup" in p else "")
                print(f"[{shape_name}] prefill {p['prompts']}x{p['prompt_len']}: engine {p['engine_prompt_tok_s']:.0f} "
                      f"prompt tok/s in {p['steps']} steps{versus}")
            report["shapes"][shape_name] = entry
    if args.json:
        print(json.dumps(report))


def print_decode(shape_name: str, rows: list[dict]) -> None:
    print(f"[{shape_name}] {'batch':>5s} {'ctx':>5s} {'step ms':>9s} {'tok/s':>10s} "
          f"{'roofline ms':>12s} {'x roofline':>10s} {'fwd ms':>7s} {'host %':>7s}  "
          "phases ms (sched/prep/model/sample/take/out)")
    for row in rows:
        ph = row["phases_ms"]
        print(f"[{shape_name}] {row['batch']:5d} {row['context']:5d} {row['step_ms']:9.3f} "
              f"{row['tok_s']:10.1f} {row['roofline_ms']:12.3f} {row['x_roofline']:10.2f} "
              f"{row['forward_graph_ms'] or float('nan'):7.3f} {100 * row['host_overhead']:6.1f}%  "
              f"{ph['schedule_s']:.3f}/{ph['prepare_s']:.3f}/{ph['model_s']:.3f}/{ph['sample_s']:.3f}/"
              f"{ph['take_s']:.3f}/{ph['output_s']:.3f}")

if __name__ == "__main__":
    main()
