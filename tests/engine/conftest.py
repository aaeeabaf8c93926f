"""Fixtures for tests/engine.

Model side first (model helper): the real SmolLM2 GGUF, our tokenizer and
float32 model loaded once per session, and the Hugging Face transformers
reference loaded from the same GGUF (also once). Engine fixtures follow below.
"""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from a model hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def gguf_path():
    from inference.engine.registry import builtin_gguf_path

    return builtin_gguf_path()


@pytest.fixture(scope="session")
def smollm_tokenizer():
    from inference.engine.tokenizer import load_tokenizer

    return load_tokenizer(SMOLLM2)


@pytest.fixture(scope="session")
def smollm_fp32():
    """Our LoadedModel of SmolLM2 in float32 on the CPU (read-only: do not modify its weights)."""
    from inference.engine.loader import load_model

    return load_model(SMOLLM2, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def hf_smollm_tokenizer(gguf_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def hf_smollm_fp32(gguf_path):
    """transformers' LlamaForCausalLM from the same GGUF, float32: the correctness reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32)
    return model.eval()


# ---- engine fixtures (engine helper): engines over the shared float32 load, prompts ----
from tests.engine.engine_fixtures import (  # noqa: E402,F401
    chat_prompts, engine_model_f32, hf_logits, hf_model_f32, make_engine, tokenizer,
)
