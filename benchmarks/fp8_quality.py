"""fp8 (E4M3) weights against bf16 on a trained model: SmolLM2-135M-Instruct, on the CPU.

    python benchmarks/fp8_quality.py                 # 16 chat prompts, 32 greedy tokens each
    python benchmarks/fp8_quality.py --json

The GPU products (kernels/fp8_matmul.py) are checked on the device against their PyTorch references
(tests/kernels/test_fp8_matmul.py: relative error under 1e-2, bf16 rounding and summation order); here
the references themselves stand in for them, so the quality of the fp8 numbers can be read on a trained
model where there is no GPU and no model on the GPU hosts (random weights, gpu_fp8.py's, amplify every
rounding chaotically). Each decoder Linear multiplies few rows (<= 16: decode) by the dequantised codes
(weight-only) and more rows (prefill) with the activations quantised per row too (W8A8), as
`inference.engine.fp8_linear.Fp8Linear` does on CUDA; ``fp8+head`` quantises the LM head as well.

Against the float32 model on the same (GGUF) weights, for bf16 and the two fp8 variants: the logits of the
prompt's last position (the prompt's products: W8A8) and of one decode step after it (weight-only) as
relative L2 error and top-1 agreement; and the engine's greedy tokens (tokens before the first divergence
from float32's, sequences identical).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from inference.engine.fp8_linear import PROJECTIONS, Fp8Linear  # noqa: E402
from kernels import fp8_matmul as fp8  # noqa: E402

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in two sentences.",
    "Give me three tips for learning Python.", "What is 17 times 23?", "Summarise the plot of Hamlet.",
    "How do vaccines work?", "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?", "Write a short limerick about a cat.", "What causes earthquakes?",
    "List the planets of the solar system.", "How does a bicycle stay upright?",
    "What is the difference between a virus and a bacterium?", "Suggest a name for a bakery.",
    "Describe a rainy day in one paragraph.",
]


class RefFp8Linear(Fp8Linear):
    """Fp8Linear with the GPU kernels' PyTorch references (what runs here on the CPU)."""

    def forward(self, x: torch.Tensor, fixed=None) -> torch.Tensor:
        if x.shape[0] <= fp8.WEIGHT_ONLY_MAX_ROWS:
            out = fp8.fp8_weight_only_ref(x, self.codes, self.scale)
        else:
            out = fp8.fp8_w8a8_ref(x, self.codes, self.scale)
        return out if self.bias is None else out + self.bias


class RefFp8Head:
    def __init__(self, weight: torch.Tensor) -> None:
        self.codes, self.scale = fp8.quantize_weight(weight.detach())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[0] <= fp8.WEIGHT_ONLY_MAX_ROWS:
            return fp8.fp8_weight_only_ref(hidden, self.codes, self.scale).float()
        return fp8.fp8_w8a8_ref(hidden, self.codes, self.scale).float()


def emulate_fp8(model, lm_head: bool) -> None:
    """Swap the decoder Linears (and the LM head) for their fp8 emulations, in place. Done after the engine is
    built: an engine refuses a model that already carries fp8 layers unless it attaches them itself (CUDA)."""
    for layer in model.layers:
        for group, name in PROJECTIONS:
            parent = getattr(layer, group)
            setattr(parent, name, RefFp8Linear(getattr(parent, name)))
    if lm_head:
        model.output_fp8 = RefFp8Head(model.output_weight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--variants", nargs="+", default=["bf16", "fp8", "fp8+head"],
                        choices=["bf16", "fp8", "fp8+head"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from gpu_fp8 import prompt_and_decode_logits  # noqa: E402 - benchmarks/ is on the path as this script's folder

    from inference.engine import Engine, EngineConfig, SamplingParams
    from inference.engine.loader import load_model

    f32 = load_model(MODEL, dtype=torch.float32, device="cpu")
    prompts = [f32.tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    sampling = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)

    def greedy(loaded, dtype: str, fp8: str | None = None) -> list[list[int]]:
        engine = Engine(EngineConfig(model=MODEL, device="cpu", dtype=dtype, kv_cache_mb=128, max_num_seqs=16,
                                     max_num_batched_tokens=1024), loaded=loaded)
        if fp8 is not None:
            emulate_fp8(loaded.model, lm_head=fp8 == "fp8+head")
        return [o.new_token_ids for o in engine.generate(prompts, sampling)]

    nexts, reference = [], []
    for prompt in prompts:
        first, _ = prompt_and_decode_logits(f32, prompt, 0)
        nexts.append(int(first.argmax()))
        reference.append(prompt_and_decode_logits(f32, prompt, nexts[-1]))
    ref_tokens = greedy(f32, "float32")
    report = {"model": MODEL, "prompts": len(prompts), "tokens": args.tokens, "variants": {}}
    for name in args.variants:
        loaded = load_model(MODEL, dtype=torch.bfloat16, device="cpu", int4_decode=False)
        fp8 = None if name == "bf16" else name
        tokens = greedy(loaded, "bfloat16", fp8)  # swaps in the emulated layers first, when fp8
        errs = {"prefill": [], "decode": []}
        top1 = {"prefill": 0, "decode": 0}
        for prompt, next_token, ref in zip(prompts, nexts, reference):
            for kind, got, want in zip(("prefill", "decode"), prompt_and_decode_logits(loaded, prompt, next_token), ref):
                errs[kind].append(((got - want).norm() / want.norm()).item())
                top1[kind] += int(got.argmax() == want.argmax())
        agree = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(tokens, ref_tokens)]
        row = {"prefill_logit_rel_err": statistics.mean(errs["prefill"]),
               "decode_logit_rel_err": statistics.mean(errs["decode"]),
               "prefill_top1": top1["prefill"], "decode_top1": top1["decode"],
               "greedy_identical": sum(a == b for a, b in zip(tokens, ref_tokens)),
               "greedy_tokens_before_divergence": statistics.mean(agree)}
        report["variants"][name] = row
        print(f"{name:8s} vs float32: logits rel. error prefill {row['prefill_logit_rel_err']:.4f} decode "
              f"{row['decode_logit_rel_err']:.4f}; top-1 {row['prefill_top1']}+{row['decode_top1']}/{2 * len(prompts)}; "
              f"greedy {row['greedy_identical']}/{len(prompts)} identical, "
              f"{row['greedy_tokens_before_divergence']:.1f} of {args.tokens} tokens agree on average")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
