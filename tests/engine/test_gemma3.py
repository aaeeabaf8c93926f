"""Issue 37's second part: Gemma 3 (interleaved sliding-window and global layers, each kind with its own rotary
base, linear rope scaling on the global ones, q/k norms, norms around attention and MLP with Gemma's 1 + weight,
scaled embeddings, GELU-tanh, query_pre_attn_scalar) and Mistral's sliding window, against transformers in
float32 on tiny random models, with prompts longer than the window: logits within tolerance and the same greedy
tokens, through the paged model (from safetensors and from a GGUF written as llama.cpp writes Gemma 3) and
through the engine (chunked prefill, a prefix-cache hit, batch-invariant mode). Nothing comes from a model hub."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.engine import rope
from inference.engine.gguf_loader import load_gguf
from inference.engine.loader import build_model, load_model
from inference.engine.model_config import RopeScaling
from inference.engine.safetensors_loader import config_from_hf
from tests.engine.arch_helpers import (
    TINY_DIMS, Q, engine_prefix_hit_gives_transformers_tokens, greedy_against_transformers, gguf_tensors,
    loaded_with_tokenizer, random_prompt, tiny_hf_model, write_gguf,
)
from tests.engine.paged_inputs import hf_logits

WINDOW = 8
GEMMA_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 50000.0},
              "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}


def hf_gemma3(*, head_dim: int = 32, layers: int = 5, pattern: int = 3, scalar: int = 48, final_cap=None,
              rope_parameters=None, seed: int = 0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**TINY_DIMS, num_hidden_layers=layers, head_dim=head_dim, rms_norm_eps=1e-6,
                              sliding_window=WINDOW, sliding_window_pattern=pattern, query_pre_attn_scalar=scalar,
                              final_logit_softcapping=final_cap, rope_parameters=rope_parameters,
                              pad_token_id=0, bos_token_id=2, eos_token_id=1)
    return tiny_hf_model(Gemma3ForCausalLM, config, seed=seed, norm_centre=0.0)  # Gemma's norms: 1 + weight


# -- configs -----------------------------------------------------------------------------------------

def test_gemma3_config_from_hf():
    hf = hf_gemma3(rope_parameters=GEMMA_ROPE)
    config = config_from_hf(hf.config.to_dict())
    assert config.architecture == "gemma3" and config.gemma and config.qk_norm and config.tie_word_embeddings
    assert [config.layer_window(i) for i in range(5)] == [WINDOW, WINDOW, 0, WINDOW, WINDOW]
    assert hf.config.layer_types[2] == "full_attention"
    assert (config.rope_theta, config.rope_local_theta) == (50000.0, 1000.0)
    assert config.rope_scaling == RopeScaling("linear", factor=8.0)
    assert config.attention_scale == 48 ** -0.5
    rotary = hf.model.rotary_emb
    assert torch.equal(rope.inv_freq(config), rotary.full_attention_inv_freq)
    assert torch.equal(rope.inv_freq(config, local=True), rotary.sliding_attention_inv_freq)
    # the older config.json spelling (rope_theta, rope_local_base_freq, rope_scaling for the global layers)
    old = {**hf.config.to_dict(), "rope_theta": 50000.0, "rope_local_base_freq": 1000.0,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "layer_types": None, "sliding_window_pattern": 3}
    old.pop("rope_parameters")
    assert config_from_hf(old) == config


@pytest.mark.parametrize("change, match", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"hidden_activation": "gelu"}, "activation 'gelu'"),
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0},
                          "sliding_attention": {"rope_type": "default"}}}, "rope scaling 'yarn'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}}, "local layers"),
    ({"layer_types": ["chunked_attention"] * 5}, "chunked_attention"),
])
def test_gemma3_settings_we_do_not_implement_are_refused_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        config_from_hf({**hf_gemma3().config.to_dict(), **change})


# -- the model against transformers --------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["plain", "linear_rope_and_final_softcap"])
def test_gemma3_safetensors_matches_transformers_past_the_window(variant, tmp_path):
    hf = hf_gemma3() if variant == "plain" else hf_gemma3(rope_parameters=GEMMA_ROPE, final_cap=3.0, seed=1)
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    assert loaded.config.final_logit_softcapping == (None if variant == "plain" else 3.0)
    greedy_against_transformers(loaded.model, hf, random_prompt(29, seed=8), steps=12)  # window 8, blocks of 8


def test_mistral_sliding_window_matches_transformers(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(**TINY_DIMS, num_hidden_layers=2, sliding_window=WINDOW)
    torch.manual_seed(2)
    hf = MistralForCausalLM(config).eval()
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    assert [loaded.config.layer_window(i) for i in range(2)] == [WINDOW, WINDOW]
    greedy_against_transformers(loaded.model, hf, random_prompt(27, seed=9), steps=8)


def gemma3_gguf_tensors(hf, types: dict) -> dict:
    """llama.cpp's Gemma 3 tensors: its norm names, norm weights written as 1 + weight."""
    w = {name: p.detach().numpy() for name, p in hf.named_parameters()}
    tensors = gguf_tensors(hf, types, permute_heads=False)  # embeddings, q/k/v/o, MLP, q/k norms, attn_norm
    names = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
             "post_ffw_norm": "post_feedforward_layernorm"}
    for i in range(hf.config.num_hidden_layers):
        for ours, theirs in names.items():
            tensors[f"blk.{i}.{ours}.weight"] = (w[f"model.layers.{i}.{theirs}.weight"], Q.F32)
    return {name: (values + 1 if "norm" in name else values, qtype) for name, (values, qtype) in tensors.items()}


@pytest.mark.slow
def test_gemma3_gguf_matches_transformers_gguf_loading(tmp_path):
    # transformers' GGUF loader takes Gemma 3's defaults for what the header lacks: query_pre_attn_scalar 256
    # (llama.cpp and we: head_dim), a global layer every 6th, local rope base 10000
    hf = hf_gemma3(head_dim=256, layers=6, pattern=6, scalar=256, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    types = {"token_embd": Q.Q8_0, "attn_q": Q.Q8_0, "attn_k": Q.Q5_0, "attn_v": Q.F16, "ffn_gate": Q.Q4_0,
             "ffn_up": Q.Q4_1, "ffn_down": Q.F16}
    path = tmp_path / "tiny-gemma3.gguf"
    write_gguf(path, "gemma3", hf, gemma3_gguf_tensors(hf, types),
               rope_theta=hf.config.rope_parameters["full_attention"]["rope_theta"],
               sliding_window=hf.config.sliding_window)
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    assert type(reference).__name__ == "Gemma3ForCausalLM" and reference.config.sliding_window == WINDOW
    config, state, _ = load_gguf(path, dtype=torch.float32)
    assert config.sliding_layers == (True,) * 5 + (False,) and config.rope_local_theta == 1e4
    model = build_model(config, state, torch.device("cpu"))
    torch.testing.assert_close(model.layers[1].mlp_output_norm.weight - 1,
                               reference.model.layers[1].post_feedforward_layernorm.weight)
    greedy_against_transformers(model, reference, random_prompt(27, 10), steps=10)


# -- through the engine: chunked prefill, a prefix-cache hit, batch-invariant mode ---------------------

@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory, smollm_tokenizer):
    return loaded_with_tokenizer(hf_gemma3(rope_parameters=GEMMA_ROPE, seed=3), tmp_path_factory.mktemp("gemma3"),
                                 smollm_tokenizer)


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_gemma3_engine_chunked_prefill_and_prefix_hit_give_transformers_tokens(tiny_gemma3, batch_invariant):
    loaded, hf = tiny_gemma3
    shared = random_prompt(40, seed=11)
    prompts = [shared + random_prompt(14, seed=12), shared + random_prompt(9, seed=13)]  # 54 and 49 tokens, window 8
    engine, greedy, expected = engine_prefix_hit_gives_transformers_tokens(
        loaded, hf, prompts, steps=12, max_num_batched_tokens=20, batch_invariant=batch_invariant)
    both = engine.generate(prompts, greedy)  # together, every prompt block from the cache
    assert [out.new_token_ids for out in both] == expected


def test_gemma3_small_blocks_one_prefill_matches_transformers(tiny_gemma3):
    """One prompt in blocks of 4 (the window spans blocks), against transformers' last-row logits."""
    from tests.engine.paged_inputs import PagedSequences

    loaded, hf = tiny_gemma3
    prompt = random_prompt(21, seed=14)
    ours = PagedSequences(loaded.model, dtype=torch.float32, num_blocks=8, block_size=4).step([("s", prompt)])
    assert (ours[0] - hf_logits(hf, prompt)[-1]).abs().max().item() < 1e-4
    assert np.isfinite(ours.numpy()).all()
