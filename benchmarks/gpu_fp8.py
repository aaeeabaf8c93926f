"""fp8 (E4M3) weights against bf16 on a GPU: quality and decode speed (EngineConfig.fp8_weights).

    python benchmarks/gpu_fp8.py                                   # Llama-3.2-1B shape, CUDA
    python benchmarks/gpu_fp8.py --shapes smollm2-135m llama-3.2-1b --json

Each shape's model is built in memory with random weights (gpu_engine.py's initialisation, no checkpoint
written) in float32 and bf16; three variants of the bf16 one are compared: bf16, fp8 decoder layers
(`fp8_weights`), fp8 layers and LM head (`fp8_lm_head` too).
  1. quality, against the float32 model on the same weights: for 8 random prompts, the logits of the last
     prompt position (the prompt's products on many rows: W8A8) and of one decode step after it (one row:
     the weight-only kernel), as relative L2 error and top-1 agreement; and the engine's greedy tokens,
     8 prompts x 32 tokens, as tokens before the first divergence from the float32 engine's;
  2. speed: engine decode steps (async scheduling, CUDA graphs) at batch 1 and 256 with 512-token contexts:
     step ms, the decode graph's replay alone, and each variant's memory roofline.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from gpu_engine import (  # noqa: E402
    SHAPES, Shape, Workload, copy_bandwidth, decode_step_times, make_engine, random_prompts, weight_bytes_of,
    write_tokenizer,
)

SPEED = Workload((1, 256), 512, 20, 0, 0, 0, 8, 32)
VARIANTS = {"bf16": {}, "fp8": {"fp8_weights": True}, "fp8+head": {"fp8_weights": True, "fp8_lm_head": True}}


def random_models(shape: Shape, device: torch.device, tok_dir: Path, seed: int = 0):
    """(float32 LoadedModel, bfloat16 LoadedModel) of one set of random weights."""
    from inference.engine.llama import LlamaForCausalLM
    from inference.engine.loader import LoadedModel
    from inference.engine.model_config import ModelConfig
    from inference.engine.registry import ModelSource
    from inference.engine.tokenizer import Tokenizer

    config = ModelConfig(architecture="llama", vocab_size=shape.vocab, hidden_size=shape.hidden,
                         intermediate_size=shape.inter, num_layers=shape.layers, num_heads=shape.heads,
                         num_kv_heads=shape.kv_heads, head_dim=shape.head_dim, rope_theta=shape.rope_theta,
                         rms_norm_eps=1e-5, max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=0, eos_token_id=1)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device=device).requires_grad_(False).eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:  # as gpu_engine.write_checkpoint: peakier logits than the default init
                param.normal_(0.0, 0.05 if "embed" not in name else 1.0, generator=gen)
            else:
                param.fill_(1.0)
    tokenizer = Tokenizer.from_hf_directory(str(tok_dir))
    source = ModelSource(f"random-{seed}", "safetensors", str(tok_dir))
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    bf16._cos_sin = {}
    return (LoadedModel(config, model, tokenizer, source, torch.float32, device),
            LoadedModel(config, bf16, tokenizer, source, torch.bfloat16, device))


@torch.inference_mode()
def prompt_and_decode_logits(loaded, prompt: list[int], next_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits [V] of the prompt's last position and of one decode step of ``next_token`` after it."""
    from inference.engine.attention_metadata import AttentionMetadata
    from inference.engine.kv_cache import allocate_kv_caches

    model, device, n = loaded.model, loaded.device, len(prompt)
    blocks = -(-(n + 1) // 16)
    caches = allocate_kv_caches(loaded.config, blocks, 16, loaded.dtype, device)
    table = torch.arange(blocks, dtype=torch.int32, device=device).view(1, blocks)
    i32 = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
    meta = AttentionMetadata(query_start_loc=i32([0, n]), seq_lens=i32([n]), block_tables=table,
                             slot_mapping=torch.arange(n, device=device), max_query_len=n, max_seq_len=n,
                             decode_only=False)
    hidden = model(torch.tensor(prompt, device=device), torch.arange(n, device=device), meta, caches)
    first = model.compute_logits(hidden[-1:])[0]
    meta = AttentionMetadata(query_start_loc=i32([0, 1]), seq_lens=i32([n + 1]), block_tables=table,
                             slot_mapping=torch.tensor([n], device=device), max_query_len=1, max_seq_len=n + 1,
                             decode_only=True)
    hidden = model(torch.tensor([next_token], device=device), torch.tensor([n], device=device), meta, caches)
    return first, model.compute_logits(hidden)[0]


def quality(f32, bf16, shape: Shape, tok_dir: Path) -> dict:
    from inference.engine import SamplingParams
    from inference.engine.fp8_linear import attach_fp8

    prompts = [p[: 24 + 23 * i] for i, p in enumerate(random_prompts(8, 200, shape.vocab, 11))]
    reference, nexts = [], []
    for prompt in prompts:
        first, _ = prompt_and_decode_logits(f32, prompt, 0)
        nexts.append(int(first.argmax()))
        reference.append(prompt_and_decode_logits(f32, prompt, nexts[-1]))
    sampling = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)

    def greedy(loaded, dtype: str, **extra) -> list[list[int]]:
        engine = make_engine(tok_dir, loaded.device, dtype, 16, 256, 1024, loaded=loaded, **extra)
        tokens = [o.new_token_ids for o in engine.generate(prompts, sampling)]
        del engine
        torch.cuda.empty_cache()
        return tokens

    ref_tokens = greedy(f32, "float32")
    # an untimed bf16 round first: the first engine of a process paid one-off host costs in its output
    # phase on the H100 (8.9 ms a step at batch 256, 2026-11-27), which is no property of bf16
    decode_step_times(tok_dir, shape, bf16.device, "bfloat16", replace(SPEED, batches=(256,), timed_steps=4),
                      bandwidth, loaded=bf16)
    out = {}
    for variant, extra in VARIANTS.items():
        if extra:
            attach_fp8(bf16.model, lm_head=bool(extra.get("fp8_lm_head")))
        rows = {"prefill": [], "decode": []}
        for prompt, next_token, ref in zip(prompts, nexts, reference):
            for kind, got, want in zip(("prefill", "decode"), prompt_and_decode_logits(bf16, prompt, next_token), ref):
                rows[kind].append(((got - want).norm() / want.norm()).item())
                rows[kind].append(int(got.argmax() == want.argmax()))
        tokens = greedy(bf16, "bfloat16", **extra)
        agree = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(tokens, ref_tokens)]
        out[variant] = {
            **{f"{kind}_logit_rel_err": statistics.mean(vals[0::2]) for kind, vals in rows.items()},
            **{f"{kind}_top1_agree": sum(vals[1::2]) for kind, vals in rows.items()},
            "of": len(prompts),
            "greedy_identical": sum(a == b for a, b in zip(tokens, ref_tokens)),
            "greedy_tokens_before_divergence": statistics.mean(agree),
        }
    return out


def speed(bf16, shape: Shape, tok_dir: Path, bandwidth: float) -> dict:
    from inference.engine.fp8_linear import attach_fp8

    # an untimed bf16 round first: the first engine of a process paid one-off host costs in its output
    # phase on the H100 (8.9 ms a step at batch 256, 2026-11-27), which is no property of bf16
    decode_step_times(tok_dir, shape, bf16.device, "bfloat16", replace(SPEED, batches=(256,), timed_steps=4),
                      bandwidth, loaded=bf16)
    out = {}
    for variant, extra in VARIANTS.items():
        if extra:
            attach_fp8(bf16.model, lm_head=bool(extra.get("fp8_lm_head")))
        weights = weight_bytes_of(shape, 2, 1 if extra.get("fp8_weights") else None,
                                  1 if extra.get("fp8_lm_head") else None)
        out[variant] = decode_step_times(tok_dir, shape, bf16.device, "bfloat16", SPEED, bandwidth, loaded=bf16,
                                         weight_bytes=weights, **extra)
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["llama-3.2-1b"], choices=sorted(SHAPES))
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_fp8.py needs a CUDA GPU with fp8 (compute capability 8.9+)")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    bandwidth = copy_bandwidth(device)
    print(f"device: {name}; copy bandwidth {bandwidth:.1f} GB/s")
    report = {"device": name, "copy_gb_s": bandwidth, "shapes": {}}
    for shape_name in args.shapes:
        shape = SHAPES[shape_name]
        with tempfile.TemporaryDirectory(prefix=f"gpu-fp8-{shape_name}-") as tmp:
            tok_dir = Path(tmp)
            write_tokenizer(shape, tok_dir)
            t = time.perf_counter()
            f32, bf16 = random_models(shape, device, tok_dir)
            entry = {"build_s": time.perf_counter() - t}
            if not args.skip_quality:
                entry["quality"] = q = quality(f32, bf16, shape, tok_dir)
                for variant, row in q.items():
                    print(f"[{shape_name}] {variant:8s} vs float32: logits rel. error prefill "
                          f"{row['prefill_logit_rel_err']:.4f} decode {row['decode_logit_rel_err']:.4f}; top-1 "
                          f"{row['prefill_top1_agree']}+{row['decode_top1_agree']}/{2 * row['of']}; greedy "
                          f"{row['greedy_identical']}/{row['of']} identical, "
                          f"{row['greedy_tokens_before_divergence']:.1f} tokens agree on average")
                _, bf16 = random_models(shape, device, tok_dir)  # fresh, without the fp8 copies
            del f32
            torch.cuda.empty_cache()
            entry["speed"] = s = speed(bf16, shape, tok_dir, bandwidth)
            for batch_index, batch in enumerate(SPEED.batches):
                base = s["bf16"][batch_index]
                for variant, rows in s.items():
                    row = rows[batch_index]
                    print(f"[{shape_name}] batch {batch:3d} {variant:8s} step {row['step_ms']:.3f} ms "
                          f"({row['tok_s']:.0f} tok/s), fwd {row['forward_graph_ms'] or float('nan'):.3f} ms, "
                          f"roofline {row['roofline_ms']:.3f} ms; vs bf16: step "
                          f"{base['step_ms'] / row['step_ms']:.2f}x, fwd "
                          f"{(base['forward_graph_ms'] or 0) / (row['forward_graph_ms'] or 1):.2f}x")
            report["shapes"][shape_name] = entry
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
