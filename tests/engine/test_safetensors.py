"""Hugging Face safetensors directories: tiny random Llama, Qwen2 (q/k/v biases) and Mistral models
saved with transformers' save_pretrained, loaded by our loader, logits compared to transformers."""

import json

import pytest
import torch

from inference.engine.loader import load_model
from inference.engine.registry import UnknownModelError, register_model, resolve_model, unregister_model
from inference.engine.safetensors_loader import config_from_hf
from tests.engine.paged_inputs import PagedSequences, hf_logits

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)


def _tiny(family: str, tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, \
        Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "mistral": (MistralConfig, MistralForCausalLM)}
    config_cls, model_cls = classes[family]
    config = config_cls(**TINY, rope_theta=5000.0, tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():  # random norms and biases too, so a mix-up of any tensor shows
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.copy_(torch.randn_like(param) * 0.5 + (1.0 if "norm" in name else 0.0))
    return model


@pytest.mark.parametrize("family,tie", [("llama", False), ("llama", True), ("qwen2", False), ("mistral", False)])
def test_tiny_models_match_transformers(family, tie, tmp_path):
    hf = _tiny(family, tie)
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    assert loaded.config.architecture == family
    assert loaded.config.attention_bias == (family == "qwen2")
    assert loaded.config.tie_word_embeddings == tie
    assert loaded.config.rope_theta == 5000.0
    assert loaded.tokenizer is None  # save_pretrained of a bare model writes no tokenizer

    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, TINY["vocab_size"], (40,), generator=generator).tolist()
    paged = PagedSequences(loaded.model, dtype=torch.float32, num_blocks=16, block_size=8)
    ours = paged.step([("s", prompt)], all_rows=True)
    assert torch.allclose(ours, hf_logits(hf, prompt), atol=1e-4)
    tokens = list(prompt)
    for _ in range(3):
        tokens.append(int(ours[-1].argmax()))
        ours = paged.step([("s", tokens[-1:])])
        assert torch.allclose(ours[0], hf_logits(hf, tokens)[-1], atol=1e-4)


def test_bfloat16_safetensors_model_is_close(tmp_path):
    hf = _tiny("qwen2", False)
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="bfloat16")
    prompt = list(range(1, 30))
    ours = PagedSequences(loaded.model, dtype=torch.bfloat16, num_blocks=8, block_size=8).step([("s", prompt)])
    reference = hf_logits(hf, prompt)[-1]
    assert torch.nn.functional.cosine_similarity(ours[0], reference, dim=0) > 0.99


def test_registered_directory_resolves_with_context_length(tmp_path):
    _tiny("llama", False).save_pretrained(tmp_path)
    try:
        source = register_model("tiny-llama-test", tmp_path)
        assert resolve_model("tiny-llama-test") == source
        assert source.kind == "safetensors" and source.context_length == TINY["max_position_embeddings"]
    finally:
        unregister_model("tiny-llama-test")
    with pytest.raises(UnknownModelError):
        resolve_model("tiny-llama-test")


def test_unsupported_configs_are_rejected(tmp_path):
    _tiny("llama", False).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="rope scaling"):
        config_from_hf({**config, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}})
    with pytest.raises(ValueError, match="model_type"):
        config_from_hf({**config, "model_type": "gpt2"})
