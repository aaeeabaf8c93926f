"""Where one single-stream decode step goes on the CPU: each part of the forward timed by a wrapper.

    python benchmarks/cpu_step_profile.py [--model smollm2-135m-instruct] [--context 550] [--steps 20]
                                          [--path native|per-op] [--json]

One request decodes after a prompt of about `--context` tokens (this repository's scheduler source through the
chat template); after 3 warm steps, `--steps` steps are timed whole and per part. `--path native` (the default
where the model takes it): the native decoder stack's call (inference/engine/native_stack.py) and, inside it,
its own per-part timers (norms, each projection, rotary + K/V store, attention, activation), then the LM head
and the sampler. `--path per-op` turns the stack off for the model and times the per-op path instead: the
Linear layers, the attention layer (and its decode kernel), the LM head, the native norm / rotary / activation
calls and the sampler; the wrappers add about a microsecond a call. What the parts leave of the step is the
engine around the forward (and, per-op, Python between the ops, the embedding and the residuals). Issue 40's
single-stream profile (docs/benchmarks/speculative.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPS = ("rms_norm", "fused_add_rms_norm", "rotary_and_store_kv", "silu_and_mul", "gelu_tanh_and_mul",
       "paged_decode_attention")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--context", type=int, default=550)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--path", choices=("native", "per-op"), default="native")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import torch

    from inference.engine import Engine, EngineConfig, SamplingParams, attention, packed_linear
    from kernels import decode_stack_cpu
    from kernels.dispatch import get_ops

    engine = Engine(EngineConfig(model=args.model, dtype=args.dtype, kv_cache_mb=256))
    text = (ROOT / "inference" / "engine" / "scheduler.py").read_text()
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": text}])[:args.context]
    engine.add_request("p", prompt, SamplingParams(max_tokens=args.steps + 8, temperature=0, ignore_eos=True))
    engine.step()  # the prompt
    spent: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)

    def timed(fn, label):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t
                calls[label] += 1
        return call

    model = engine.runner.model
    if args.path == "per-op":
        model.native_stack = False
    decode_stack_cpu.run = timed(decode_stack_cpu.run, "native decoder stack (one call)")
    ops = get_ops(torch.device(engine.config.device))
    for name in OPS:
        if hasattr(ops, name):
            object.__setattr__(ops, name, timed(getattr(ops, name), f"ops.{name}"))  # a frozen dataclass
    packed_linear.Linear.forward = timed(packed_linear.Linear.forward, "Linear layers")
    attention.PagedAttention.forward = timed(attention.PagedAttention.forward, "attention layer")
    model_cls = type(engine.runner.model)
    model_cls.compute_logits = timed(model_cls.compute_logits, "LM head (compute_logits)")
    engine.sampler.launch = timed(engine.sampler.launch, "sampler")
    for _ in range(3):
        engine.step()
    native = bool(model.native_stack)
    if native:
        decode_stack_cpu.profile(True)
    spent.clear()
    calls.clear()
    t = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    step_ms = (time.perf_counter() - t) / args.steps * 1e3
    parts = {label: {"ms": spent[label] / args.steps * 1e3, "calls": calls[label] // args.steps} for label in spent}
    inside = {f"  in the stack: {part}": {"ms": seconds / args.steps * 1e3, "calls": 0}
              for part, seconds in decode_stack_cpu.profile(False).items()} if native else {}
    path = "native stack" if native else "per-op path"
    if args.json:
        print(json.dumps({"step_ms": step_ms, "context": len(prompt), "path": path, "parts": parts,
                          "stack_parts": {label.split(": ", 1)[1]: part["ms"] for label, part in inside.items()}}))
        return
    print(f"step {step_ms:.1f} ms ({args.model}, {args.dtype}, context {len(prompt)} tokens, {path})")
    for label, part in sorted(parts.items(), key=lambda kv: -kv[1]["ms"]):
        print(f"  {label:34s} {part['ms']:7.2f} ms  {part['calls']:4d} calls")
        if label.startswith("native decoder stack"):
            for sub, sub_part in sorted(inside.items(), key=lambda kv: -kv[1]["ms"]):
                print(f"  {sub:34s} {sub_part['ms']:7.2f} ms")


if __name__ == "__main__":
    main()
