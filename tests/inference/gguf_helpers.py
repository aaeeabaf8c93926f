"""A tiny base-model GGUF (random Llama weights, a byte-level tokenizer, no chat template) for the served-model
tests: what `manage.py model_add` reads (context length, tokenizer, architecture) and what an engine can load."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, CONTEXT = 64, 96, 2, 4, 2, 256


def _tokens() -> list[str]:
    from inference.engine.tokenizer import byte_alphabet

    return [*byte_alphabet().values(), "<|endoftext|>"]


def tiny_base_gguf(path: Path, *, chat_template: str | None = None) -> Path:
    """Write the file; `chat_template` adds tokenizer.chat_template (an instruct model)."""
    from gguf import GGUFWriter

    tokens = _tokens()
    vocab, rng = len(tokens), np.random.default_rng(0)
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 1) + [3])
    writer.add_token_merges([])
    writer.add_eos_token_id(vocab - 1)
    writer.add_bos_token_id(vocab - 1)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    kv = KV_HEADS * HIDDEN // HEADS
    weights = {"token_embd.weight": (vocab, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        weights |= {f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
                    f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN), f"blk.{i}.attn_k.weight": (kv, HIDDEN),
                    f"blk.{i}.attn_v.weight": (kv, HIDDEN), f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
                    f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
                    f"blk.{i}.ffn_down.weight": (HIDDEN, FFN)}
    for name, shape in weights.items():
        values = np.ones(shape) if name.endswith("norm.weight") else rng.normal(scale=0.05, size=shape)
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
