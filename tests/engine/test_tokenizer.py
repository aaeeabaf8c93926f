"""Our tokenizer (built from GGUF metadata with `tokenizers`) against transformers' tokenizer loaded
from the same GGUF.

One known difference, on purpose: the file names the `smollm` pre-tokenizer, which llama.cpp (and
SmolLM2's own tokenizer.json) define as "split every digit, then GPT-2's regex". transformers'
GGUF loader has no entry for `smollm` and falls back to GPT-2's regex alone, so the two disagree
exactly when a run of two or more whitespace characters ends right before a digit ("  1"): there
llama.cpp and we keep the whole run together ("ĠĠ", "1") and transformers splits off the last
space ("Ġ", "Ġ", "1"). We follow the model's real tokenizer. The corpus is therefore compared
(a) in full against transformers' tokenizer with the `smollm` split put back, and (b) text by text
against stock transformers wherever that case does not occur.
"""

import re
import subprocess
import sys

import pytest
from tokenizers import pre_tokenizers

from inference.engine.tokenizer import load_tokenizer

CORPUS = [
    "Hello, world! How are you today?",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) {\n\tprintf(\"%d\\n\", i);\n}",
    "x = [\n    1,\n    22,\n    333]\n",
    "   leading spaces, trailing spaces   ",
    "tabs\t\tand\n\n\nnewlines \r\n windows line ends",
    "multiple     internal      spaces and\u00a0non-breaking",
    "Numbers: 3.14159, 2024-06-01, 1,000,000 and 42nd",
    "  1. indented numbered list\n  2. second item",
    "你好，世界！这是一个测试。日本語のテキストも。한국어 문장.",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "Accents: café, naïve, résumé, Ångström, façade, jalapeño, Zürich",
    "Ελληνικά και русский текст, also עברית and العربية",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after eos<repo_name>repo<file_sep>",
    "I'm sure they'll say we've done what you'd expect, isn't it?",
    "URL https://example.com/path?q=1&x=%20y and email a.b@c.org",
    "{\"json\": [true, false, null], \"n\": -12.5e3}",
    "",
    " ",
    "\n",
]

WHITESPACE_RUN_BEFORE_DIGIT = re.compile(r"\s{2,}(?=\d)")


@pytest.fixture(scope="module")
def hf_with_smollm_split(hf_smollm_tokenizer):
    backend = hf_smollm_tokenizer.backend_tokenizer.__class__.from_str(hf_smollm_tokenizer.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return backend


@pytest.mark.parametrize("text", CORPUS)
def test_ids_equal_transformers_tokenizer(text, smollm_tokenizer, hf_smollm_tokenizer, hf_with_smollm_split):
    ours = smollm_tokenizer.encode(text)
    assert ours == hf_with_smollm_split.encode(text, add_special_tokens=False).ids
    if not WHITESPACE_RUN_BEFORE_DIGIT.search(text):
        assert ours == hf_smollm_tokenizer.encode(text, add_special_tokens=False)
    assert smollm_tokenizer.decode(ours, skip_special_tokens=False) == text
    assert smollm_tokenizer.decode(ours) == hf_smollm_tokenizer.decode(ours, skip_special_tokens=True)


def test_the_known_difference_is_the_smollm_digit_split(smollm_tokenizer):
    # llama.cpp's smollm pre-tokenizer: "\p{N}" first, so "  1" keeps its two spaces together.
    assert [smollm_tokenizer.id_to_token(i) for i in smollm_tokenizer.encode("  1")] == ["ĠĠ", "1"]
    assert [smollm_tokenizer.id_to_token(i) for i in smollm_tokenizer.encode(" 123")] == ["Ġ", "1", "2", "3"]


def test_special_tokens_and_facts(smollm_tokenizer, hf_smollm_tokenizer):
    tok = smollm_tokenizer
    assert tok.vocab_size == 49152 == len(hf_smollm_tokenizer)
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.all_special_ids == list(range(17))
    assert set(tok.all_special_ids) >= set(hf_smollm_tokenizer.all_special_ids)
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")  # the file says add_bos_token false
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.id_to_token(tok.encode(" hello")[0]) == "Ġhello"


def test_token_bytes_rebuild_multibyte_text(smollm_tokenizer):
    text = "naïve 你好 😀"
    ids = smollm_tokenizer.encode(text)
    assert b"".join(smollm_tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")
    emoji = smollm_tokenizer.encode("😀")
    assert len(emoji) > 1  # split inside the character: no piece is valid UTF-8 alone
    assert smollm_tokenizer.token_bytes(2) == b"<|im_end|>"


def test_load_tokenizer_is_cached_and_needs_no_torch():
    assert load_tokenizer("smollm2-135m-instruct") is load_tokenizer("smollm2-135m-instruct")
    script = ("import sys; from inference.engine.tokenizer import load_tokenizer; "
              "t = load_tokenizer('smollm2-135m-instruct'); assert t.encode('hi'); "
              "assert 'torch' not in sys.modules, 'the web process must not need torch to tokenize'")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_hugging_face_directory_tokenizer(tmp_path, smollm_tokenizer):
    import json

    from inference.engine.tokenizer import Tokenizer

    smollm_tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
        "chat_template": smollm_tokenizer.chat_template}))
    loaded = Tokenizer.from_hf_directory(tmp_path)
    text = CORPUS[1] + CORPUS[9] + CORPUS[10]
    assert loaded.encode(text) == smollm_tokenizer.encode(text)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.vocab_size) == (1, 2, 49152)
    assert loaded.all_special_ids == smollm_tokenizer.all_special_ids
    messages = [{"role": "user", "content": "hi"}]
    assert loaded.encode_chat(messages) == smollm_tokenizer.encode_chat(messages)
    assert loaded.token_bytes(loaded.encode(" é")[0]) == smollm_tokenizer.token_bytes(loaded.encode(" é")[0])
