"""Issue 37's first part: Llama 3.x rope scaling ("llama3") and Qwen3 (per-head q/k norms, head_dim other than
hidden/heads), from safetensors (transformers' save_pretrained) and from GGUF files written with gguf.GGUFWriter
the way llama.cpp's converter writes them, against transformers in float32: logits within tolerance and the
same greedy tokens, over sequences of several KV blocks, through the paged model and through the engine
(chunked prefill, a prefix-cache hit). Tiny random models built here; nothing comes from a model hub."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from inference.engine import rope
from inference.engine.gguf_loader import config_from_gguf_metadata, load_gguf, read_gguf_config
from inference.engine.loader import build_model, load_model
from inference.engine.model_config import RopeScaling
from inference.engine.safetensors_loader import config_from_hf
from tests.engine.arch_helpers import (
    TINY_DIMS, Q, engine_prefix_hit_gives_transformers_tokens, greedy_against_transformers, gguf_tensors,
    loaded_with_tokenizer, random_prompt, tiny_hf_model, write_gguf,
)
from tests.engine.paged_inputs import PagedSequences, hf_logits

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # head_dim 16: all three bands


def hf_llama3(tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY_DIMS, num_hidden_layers=2, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                         rope_parameters=dict(LLAMA3_ROPE))
    return tiny_hf_model(LlamaForCausalLM, config, seed=0)


def hf_qwen3(head_dim: int = 32, tie: bool = False):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**TINY_DIMS, num_hidden_layers=2, head_dim=head_dim, rms_norm_eps=1e-6,
                         rope_theta=5000.0, tie_word_embeddings=tie)
    return tiny_hf_model(Qwen3ForCausalLM, config, seed=1)


# -- rope scaling: frequencies and configs ---------------------------------------------------------

def test_llama3_frequencies_equal_transformers_bit_for_bit():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = hf_llama3().config
    expected, scale = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    config = config_from_hf(hf_config.to_dict())
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    assert scale == 1.0 and torch.equal(rope.inv_freq(config), expected)
    unscaled = rope.default_inv_freq(16, 5000.0)
    assert (expected == unscaled).any() and (expected == unscaled / 8).any()  # high and low bands
    assert ((expected != unscaled) & (expected != unscaled / 8)).any()  # and the interpolated band
    # the older config.json spelling: rope_scaling + a top-level rope_theta
    old = {**LlamaConfig(hidden_size=64, num_attention_heads=4).to_dict(), "rope_theta": 5000.0,
           "rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}}
    old.pop("rope_parameters", None)
    assert config_from_hf(old).rope_scaling == config.rope_scaling and config_from_hf(old).rope_theta == 5000.0


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "longrope"])
def test_rope_types_not_implemented_are_refused_by_name(rope_type):
    config = {**hf_llama3().config.to_dict(), "rope_parameters": {"rope_type": rope_type, "rope_theta": 1e4,
                                                                   "factor": 4.0}}
    with pytest.raises(ValueError, match=f"rope scaling '{rope_type}'"):
        config_from_hf(config)
    with pytest.raises(ValueError, match="'yarn'"):
        RopeScaling("yarn")
    metadata = {"general.architecture": "llama", "llama.rope.scaling.type": rope_type}
    with pytest.raises(ValueError, match=f"rope scaling '{rope_type}'"):
        config_from_gguf_metadata(metadata, set())


def test_other_unsupported_qwen_and_rope_settings_are_refused():
    qwen3 = hf_qwen3().config.to_dict()
    with pytest.raises(ValueError, match="use_sliding_window"):
        config_from_hf({**qwen3, "use_sliding_window": True})
    with pytest.raises(ValueError, match="partial"):
        config_from_hf({**qwen3, "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="per-layer-type"):
        config_from_hf({**qwen3, "rope_parameters": {"full_attention": {"rope_type": "default"}}})
    with pytest.raises(ValueError, match="needs factor"):
        RopeScaling("llama3", factor=8.0)


# -- safetensors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_safetensors_models_match_transformers(family, tmp_path):
    hf = hf_llama3() if family == "llama3" else hf_qwen3()
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    config = loaded.config
    if family == "qwen3":
        assert config.architecture == "qwen3" and config.qk_norm and not config.attention_bias
        assert config.head_dim == 32 != config.hidden_size // config.num_heads
        assert config.rope_scaling is None
    else:
        assert config.rope_scaling.from_params and not config.qk_norm
    greedy_against_transformers(loaded.model, hf, random_prompt(44), steps=10)  # 6 blocks of 8


def test_bfloat16_qwen3_is_close(tmp_path):
    hf = hf_qwen3()
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="bfloat16")
    prompt = random_prompt(30, seed=2)
    ours = PagedSequences(loaded.model, dtype=torch.bfloat16, num_blocks=8, block_size=8).step([("s", prompt)])
    assert torch.nn.functional.cosine_similarity(ours[0], hf_logits(hf, prompt)[-1], dim=0) > 0.99


# -- GGUF --------------------------------------------------------------------------------------------

def llama_cpp_rope_freqs(params: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's converter's rope_freqs for a "llama3" rope (per-frequency divisors, float64 math)."""
    base, factor = params["rope_theta"], params["factor"]
    low, high, old = params["low_freq_factor"], params["high_freq_factor"], params["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def test_llama3_gguf_with_rope_freqs_matches_transformers(tmp_path):
    hf = hf_llama3()
    tensors = gguf_tensors(hf, {"attn_v": Q.F16, "ffn_up": Q.F16}, permute_heads=True)
    tensors["rope_freqs.weight"] = (llama_cpp_rope_freqs(LLAMA3_ROPE, 16), Q.F32)
    for name, (values, qtype) in list(tensors.items()):  # transformers reads what the file holds
        if qtype == Q.F16:
            tensors[name] = (values.astype(np.float16).astype(np.float32), qtype)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("v_proj.weight", "up_proj.weight")):
                param.copy_(param.half().float())
    path = tmp_path / "tiny-llama3.gguf"
    write_gguf(path, "llama", hf, tensors)
    header_config = read_gguf_config(path)  # the header says "llama3 scaling", the factors are tensor data
    assert header_config.rope_scaling == RopeScaling() and not header_config.rope_scaling.from_params
    config, state, _ = load_gguf(path, dtype=torch.float32)
    assert len(config.rope_scaling.freq_factors) == 8
    torch.testing.assert_close(rope.inv_freq(config), rope.inv_freq(config_from_hf(hf.config.to_dict())),
                               rtol=1e-6, atol=0)  # llama.cpp's divisors: within a rounding of transformers'
    # transformers' GGUF loader ignores rope_freqs, so the reference is the same weights from the HF config
    greedy_against_transformers(build_model(config, state, torch.device("cpu")), hf, random_prompt(44, 3), steps=10)


@pytest.mark.slow
def test_qwen3_gguf_with_quantized_tensors_matches_transformers_gguf_loading(tmp_path):
    # transformers' GGUF loader reads no qwen3 head_dim (attention.key_length) and takes Qwen3's default of 128
    hf = hf_qwen3(head_dim=128, tie=True)
    types = {"token_embd": Q.Q8_0, "attn_q": Q.Q8_0, "attn_k": Q.Q5_0, "attn_v": Q.Q5_1, "attn_output": Q.F16,
             "ffn_gate": Q.Q4_0, "ffn_up": Q.Q4_1, "ffn_down": Q.F16, "attn_q_norm": Q.F32}
    path = tmp_path / "tiny-qwen3.gguf"
    write_gguf(path, "qwen3", hf, gguf_tensors(hf, types, permute_heads=False))
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    assert type(reference).__name__ == "Qwen3ForCausalLM" and reference.config.head_dim == 128
    config, state, _ = load_gguf(path, dtype=torch.float32)
    assert (config.architecture, config.head_dim, config.qk_norm, config.tie_word_embeddings) == \
        ("qwen3", 128, True, True)
    model = build_model(config, state, torch.device("cpu"))
    assert torch.equal(model.layers[1].self_attn.k_norm.weight, reference.model.layers[1].self_attn.k_norm.weight)
    greedy_against_transformers(model, reference, random_prompt(44, 4), steps=10)


# -- through the engine: chunked prefill and a prefix-cache hit ------------------------------------

@pytest.fixture(scope="module", params=["llama3", "qwen3"])
def tiny_engine_model(request, tmp_path_factory, smollm_tokenizer):
    """(a LoadedModel of a tiny random model from safetensors, with SmolLM2's tokenizer; its HF reference)."""
    hf = hf_llama3() if request.param == "llama3" else hf_qwen3()
    return loaded_with_tokenizer(hf, tmp_path_factory.mktemp(request.param), smollm_tokenizer)


@pytest.mark.slow
def test_engine_chunked_prefill_and_prefix_hit_give_transformers_tokens(tiny_engine_model):
    loaded, hf = tiny_engine_model
    shared = random_prompt(40, seed=5)
    prompts = [shared + random_prompt(30, seed=6), shared + random_prompt(25, seed=7)]  # 70, 65 tokens: 5 blocks of 16
    engine_prefix_hit_gives_transformers_tokens(loaded, hf, prompts, steps=12,
                                                max_num_batched_tokens=24)  # prompts in chunks
