"""Engine test fixtures, imported at the end of tests/engine/conftest.py. They build on
the model helper's session fixtures there (smollm_fp32, hf_smollm_fp32): one float32
load shared by every engine, the HF transformers reference, chat prompts."""

from __future__ import annotations

import pytest
import torch

MODEL = "smollm2-135m-instruct"

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "请用中文介绍一下长城。",
    "日本の首都はどこですか？",
    "Explain recursion to a five year old 🙂",
    "Translate 'good morning' into Spanish, French and German.",
    "List three prime numbers and explain why they are prime.",
    "What does this emoji mean: 🚀🔥?",
    "def add(a, b):\n    return a + b\n\nWhat does this Python function do?",
    "Give me a short recipe for pancakes.",
]


@pytest.fixture(scope="session")
def engine_model_f32(smollm_fp32):
    """The float32 LoadedModel shared by all engine tests (weights loaded once)."""
    return smollm_fp32


@pytest.fixture(scope="session")
def make_engine(engine_model_f32):
    """make_engine(**EngineConfig overrides) -> Engine over the shared float32 weights."""
    from inference.engine import Engine, EngineConfig

    def make(**overrides):
        cfg = dict(model=MODEL, device="cpu", dtype="float32", kv_cache_mb=64, max_num_seqs=32,
                   max_num_batched_tokens=512)
        cfg.update(overrides)
        return Engine(EngineConfig(**cfg), loaded=engine_model_f32)

    return make


@pytest.fixture(scope="session")
def tokenizer(engine_model_f32):
    return engine_model_f32.tokenizer


@pytest.fixture(scope="session")
def chat_prompts(tokenizer):
    """Token ids of chat-templated prompts (English, CJK, emoji, code)."""
    return [tokenizer.encode_chat([{"role": "user", "content": c}]) for c in CHAT_PROMPTS]


@pytest.fixture(scope="session")
def hf_model_f32(hf_smollm_fp32):
    """Hugging Face transformers' LlamaForCausalLM on the same GGUF, float32 (the reference)."""
    return hf_smollm_fp32


@pytest.fixture(scope="session")
def hf_logits(hf_model_f32):
    """hf_logits(prompt_ids, output_ids) -> [len(output_ids), V] float32 logits that the HF float32
    model gives for each output position (teacher forcing: one forward over prompt + output)."""

    @torch.inference_mode()
    def run(prompt: list[int], output: list[int]) -> torch.Tensor:
        logits = hf_model_f32(torch.tensor([prompt + output])).logits[0].float()
        return logits[len(prompt) - 1: len(prompt) - 1 + len(output)]

    return run
