"""Helpers shared by the tiny-architecture tests (test_architectures.py, test_gemma3.py): tiny random
transformers models, a prompt, greedy decoding against transformers through the paged model and through the
engine, and GGUF files written with gguf.GGUFWriter the way llama.cpp's converter writes them. Nothing comes
from a model hub."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize as gguf_quantize

from inference.engine.loader import load_model
from tests.engine.paged_inputs import PagedSequences, hf_logits

Q = GGMLQuantizationType
VOCAB = 320
TOLERANCE = 1e-4  # float32 logits
TINY_DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)


# -- tiny models and prompts -------------------------------------------------------------------------

def randomise_norms(model, centre: float = 1.0) -> None:
    """Random norm weights (q/k norms included) around `centre`, so that a mixed-up or missing norm shows
    (Gemma's norms scale by 1 + weight: centre 0)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                values = torch.randn_like(param) * 0.5
                param.copy_(values + centre if centre else values)


def tiny_hf_model(model_class, config, seed: int, norm_centre: float = 1.0):
    """`model_class(config)` in eval mode, its weights from `seed`, its norms randomised."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomise_norms(model, norm_centre)
    return model


def random_prompt(length: int, seed: int = 0) -> list[int]:
    return torch.randint(1, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


# -- against transformers ------------------------------------------------------------------------------

def greedy_against_transformers(model, hf, prompt: list[int], steps: int, block_size: int = 8) -> float:
    """Prefill `prompt` through the paged model, then `steps` greedy decodes; every step's logits against
    transformers' on the whole sequence and the same argmax. -> the worst |logit difference|."""
    paged = PagedSequences(model, dtype=torch.float32, num_blocks=64, block_size=block_size)
    ours = paged.step([("s", prompt)], all_rows=True)
    reference = hf_logits(hf, prompt)
    tokens, worst = list(prompt), 0.0
    for _ in range(steps):
        worst = max(worst, (ours - reference[-ours.shape[0]:]).abs().max().item())
        assert worst < TOLERANCE
        token = int(reference[-1].argmax())
        assert int(ours[-1].argmax()) == token
        tokens.append(token)
        ours = paged.step([("s", [token])])
        reference = hf_logits(hf, tokens)
    return worst


def hf_greedy(hf, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(hf_logits(hf, tokens)[-1].argmax()))
    return tokens[len(prompt):]


# -- through the engine ----------------------------------------------------------------------------------

def loaded_with_tokenizer(hf, path, tokenizer):
    """(a LoadedModel of `hf` saved to `path` as safetensors, with `tokenizer`; `hf`, its reference)."""
    hf.save_pretrained(path)
    loaded = load_model(str(path), dtype=torch.float32, device="cpu")
    return dataclasses.replace(loaded, tokenizer=tokenizer), hf


def engine_prefix_hit_gives_transformers_tokens(loaded, hf, prompts: list[list[int]], steps: int, **config):
    """Two prompts that share their first 40 tokens, one after the other through a float32 CPU engine (blocks of
    16, prompts in chunks of `config`'s max_num_batched_tokens): the first without a cache hit, the second with
    the shared 32 block-aligned tokens from the cache, each giving transformers' greedy tokens.
    -> (the engine, its greedy SamplingParams, the expected tokens), for more runs."""
    from inference.engine import Engine, EngineConfig, SamplingParams

    expected = [hf_greedy(hf, p, steps) for p in prompts]
    engine = Engine(EngineConfig(model=loaded.source.path, device="cpu", dtype="float32", num_kv_blocks=32,
                                 max_num_seqs=4, block_size=16, **config), loaded=loaded)
    greedy = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    first = engine.generate([prompts[0]], greedy)[0]
    assert first.usage.cached_tokens == 0 and first.new_token_ids == expected[0]
    second = engine.generate([prompts[1]], greedy)[0]
    assert second.usage.cached_tokens == 32  # the shared 40 tokens, block-aligned
    assert second.new_token_ids == expected[1]
    return engine, greedy, expected


# -- GGUF ------------------------------------------------------------------------------------------------

def gguf_tensors(hf, types: dict[str, Q], permute_heads: bool) -> dict[str, tuple[np.ndarray, Q]]:
    """The HF model's weights under llama.cpp's names (Q/K rows permuted for the "llama" arch), in `types`
    (by GGUF suffix; F32 for anything not named)."""
    from tests.engine.test_gguf_loader import llama_cpp_permute

    w = {name: p.detach().numpy() for name, p in hf.named_parameters()}
    config = hf.config
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    layer_names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                   "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                   "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                   "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for i in range(config.num_hidden_layers):
        names.update({f"blk.{i}.{k}": f"model.layers.{i}.{v}" for k, v in layer_names.items()})
    tensors = {}
    for gguf_name, hf_name in names.items():
        if f"{hf_name}.weight" not in w or (gguf_name == "output" and config.tie_word_embeddings):
            continue
        values = w[f"{hf_name}.weight"]
        suffix = gguf_name.rsplit(".", 1)[-1]
        if permute_heads and suffix in ("attn_q", "attn_k"):
            values = llama_cpp_permute(values, config.num_attention_heads if suffix == "attn_q"
                                       else config.num_key_value_heads)
        tensors[f"{gguf_name}.weight"] = (values, types.get(suffix, Q.F32))
    return tensors


def write_gguf(path, arch: str, hf, tensors: dict[str, tuple[np.ndarray, Q]], *, rope_theta: float | None = None,
               sliding_window: int | None = None) -> None:
    """A GGUF file of `hf`'s config and `tensors` (each quantized to its type); the rope base is the config's
    rope_theta unless given, a sliding window written only where given."""
    config = hf.config
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"] if rope_theta is None else rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    writer.add_vocab_size(config.vocab_size)
    for name, (values, qtype) in tensors.items():
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, values.astype(np.float32 if qtype == Q.F32 else np.float16))
        else:
            writer.add_tensor(name, gguf_quantize(values.astype(np.float32), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
