"""Our Llama over the paged KV cache against transformers' LlamaForCausalLM, both loaded from the
same SmolLM2 GGUF in float32."""

import pytest
import torch

from inference.engine import cpu_matmul, packed_linear
from inference.engine.kv_cache import allocate_kv_caches, kv_bytes_per_block, num_blocks_for_budget
from inference.engine.loader import load_model
from inference.engine.packed_linear import Linear
from tests.engine.paged_inputs import PagedSequences

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "List three prime numbers:\n  1. two\n  2."}],
    [{"role": "user", "content": "请用一句话介绍你自己。😀 Merci beaucoup, déjà vu!"}],
]
DECODE_STEPS = 6
LOGIT_TOLERANCE = 2e-3  # float32; measured max difference is ~4e-5


@pytest.mark.parametrize("chat", CHATS, ids=["plain", "system-digits", "cjk-emoji"])
def test_prefill_and_decode_match_transformers_fp32(chat, smollm_fp32, hf_smollm_fp32, smollm_tokenizer):
    prompt = smollm_tokenizer.encode_chat(chat)
    paged = PagedSequences(smollm_fp32.model, dtype=torch.float32)
    ours = paged.step([("s", prompt)], all_rows=True)
    with torch.inference_mode():
        out = hf_smollm_fp32(torch.tensor([prompt]), use_cache=True)
    reference, past = out.logits[0].float(), out.past_key_values
    worst = (ours - reference).abs().max().item()
    assert worst < LOGIT_TOLERANCE

    for _ in range(DECODE_STEPS):  # our paged decode against transformers' own KV-cached decode
        next_token = int(ours[-1].argmax())
        assert next_token == int(reference[-1].argmax())
        ours = paged.step([("s", [next_token])])
        with torch.inference_mode():
            out = hf_smollm_fp32(torch.tensor([[next_token]]), past_key_values=past, use_cache=True)
        reference, past = out.logits[0].float(), out.past_key_values
        worst = max(worst, (ours - reference).abs().max().item())
        assert worst < LOGIT_TOLERANCE
    print(f"max |logit difference| vs transformers fp32 over prefill+{DECODE_STEPS} decodes: {worst:.2e}")


def test_mixed_batches_with_chunked_prefill_match_single_sequences(smollm_fp32, smollm_tokenizer):
    model = smollm_fp32.model
    texts = ["Write a haiku about the sea, then explain its imagery in detail, line by line, please. " * 2,
             "Hi!", "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"]
    prompts = [smollm_tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    assert len(prompts[0]) > 48  # spans several blocks and is split in chunks below

    alone = []
    for i, prompt in enumerate(prompts):
        paged = PagedSequences(model, dtype=torch.float32, seed=i + 1)
        logits = [paged.step([("s", prompt)])[0]]
        for token in (11, 22, 33):
            logits.append(paged.step([("s", [token])])[0])
        alone.append(torch.stack(logits))

    a, b, c = prompts
    paged = PagedSequences(model, dtype=torch.float32, seed=7)
    first = paged.step([("a", a[:37]), ("b", b)])  # a: first chunk (no logits needed); b: whole prompt
    second = paged.step([("a", a[37:]), ("b", [11]), ("c", c)])  # chunk + decode + fresh prefill
    third = paged.step([("c", [11]), ("a", [11]), ("b", [22])])  # decode-only batch, any order
    fourth = paged.step([("a", [22]), ("c", [22]), ("b", [33])])
    tol = 1e-3
    assert torch.allclose(first[1], alone[1][0], atol=tol)
    assert torch.allclose(second[0], alone[0][0], atol=tol)
    assert torch.allclose(second[1], alone[1][1], atol=tol)
    assert torch.allclose(second[2], alone[2][0], atol=tol)
    assert torch.allclose(third[0], alone[2][1], atol=tol)
    assert torch.allclose(third[1], alone[0][1], atol=tol)
    assert torch.allclose(third[2], alone[1][2], atol=tol)
    assert torch.allclose(fourth[0], alone[0][2], atol=tol)
    assert torch.allclose(fourth[1], alone[2][2], atol=tol)
    assert torch.allclose(fourth[2], alone[1][3], atol=tol)


def test_compute_logits_only_for_rows_asked(smollm_fp32):
    model = smollm_fp32.model
    hidden = torch.randn(3, model.config.hidden_size)
    logits = model.compute_logits(hidden[1:])
    assert logits.shape == (2, model.config.vocab_size) and logits.dtype == torch.float32
    with pytest.raises(ValueError, match="KV caches"):
        PagedSequences(model, dtype=torch.float32).model(torch.tensor([1]), torch.tensor([0]), None, [])


def test_bfloat16_model_tracks_float32(smollm_fp32, smollm_tokenizer, monkeypatch):
    bf16 = load_model("smollm2-135m-instruct", dtype=torch.bfloat16, device="cpu")
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    packed = [m for m in bf16.model.modules() if getattr(m, "int4_weight", None) is not None]
    assert len(packed) == 4 * bf16.config.num_layers  # every Q4_1 projection also packed for decode
    assert all(getattr(m, "int4_weight", None) is None for m in smollm_fp32.model.modules())
    # On CPUs with the bf16 GEMM, every dense weight also gets a oneDNN-blocked copy (cpu_matmul.prepack).
    prepacked = cpu_matmul.prepack_enabled(bf16.model.embed_tokens.weight)
    assert all((m.prepacked is not None) is prepacked for m in bf16.model.modules() if isinstance(m, Linear))
    assert (bf16.model.output_prepacked is not None) is prepacked
    assert all(m.prepacked is None for m in smollm_fp32.model.modules() if isinstance(m, Linear))
    # The tied Q8_0 embedding is also kept as its exact int8 blocks for the few-row LM head (bf16 only).
    assert smollm_fp32.model.output_int8 is None
    head = bf16.model.output_int8
    assert head is not None and head.codes.dtype == torch.int8
    assert torch.equal(head.dequantize(), smollm_fp32.model.embed_tokens.weight)
    hidden = torch.randn(packed_linear.INT8_MAX_ROWS + 1, bf16.config.hidden_size).bfloat16()
    assert torch.equal(bf16.model.compute_logits(hidden[:1]), head.matmul(hidden[:1]))
    dense = cpu_matmul.linear(hidden, bf16.model.embed_tokens.weight).float()
    assert torch.equal(bf16.model.compute_logits(hidden), dense)  # more rows: the dense GEMM

    prompt = smollm_tokenizer.encode_chat(CHATS[0])
    ref = PagedSequences(smollm_fp32.model, dtype=torch.float32).step([("s", prompt)])[0]
    paged = PagedSequences(bf16.model, dtype=torch.bfloat16)
    ours = paged.step([("s", prompt)])[0]
    assert int(ours.argmax()) == int(ref.argmax())
    assert torch.nn.functional.cosine_similarity(ours, ref, dim=0) > 0.995

    # The packed int4 / int8 decode path and the dense path agree to bf16 precision.
    token = int(ours.argmax())
    int4_logits = paged.step([("s", [token])])[0]
    paged.lens["s"] -= 1  # rewind one position and run the same step densely
    monkeypatch.setattr(packed_linear, "INT4_MAX_ROWS", 0)
    monkeypatch.setattr(packed_linear, "INT4_MAX_ROWS_UPCAST", 0)
    monkeypatch.setattr(packed_linear, "INT4_ALL_ROWS", 0)
    monkeypatch.setattr(packed_linear, "INT8_MAX_ROWS", 0)
    dense_logits = paged.step([("s", [token])])[0]
    assert int(int4_logits.argmax()) == int(dense_logits.argmax())
    # Measured: > 0.999 on an AMX Xeon, 0.9985 on an AVX2-only EPYC, whose int4 and bf16 matmul
    # kernels round differently.
    assert torch.nn.functional.cosine_similarity(int4_logits, dense_logits, dim=0) > 0.997


def test_kv_cache_sizes(smollm_fp32):
    config = smollm_fp32.config
    per_block = kv_bytes_per_block(config, 16, torch.bfloat16)
    assert per_block == 2 * 30 * 16 * 3 * 64 * 2
    assert num_blocks_for_budget(config, 512 * 2**20, 16, torch.bfloat16) == 512 * 2**20 // per_block
    caches = allocate_kv_caches(config, 4, 16, torch.bfloat16, "cpu")
    assert len(caches) == 30
    assert caches[0][0].shape == (4, 16, 3, 64) and caches[0][1].dtype == torch.bfloat16
    assert not caches[0][0].any()
