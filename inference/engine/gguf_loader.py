"""GGUF files: metadata, architecture config, and weights in our parameter layout.

`read_gguf_header` / `read_gguf_metadata` parse only the header (key/values
and tensor infos; no tensor data touched, no torch needed): the tokenizer uses
them in the web process. `load_gguf` reads tensors through `gguf.GGUFReader`
(a memory map) and dequantises them with `dequant.dequantize`.

llama.cpp's converter permutes the rows of the Q and K projections of Llama
models so that its "normal" rotary embedding pairs adjacent elements
(x0,x1),(x2,x3)...; our rotary embedding is the Hugging Face "rotate half"
kind that pairs (x_i, x_{i+D/2}), so we undo that permutation on load.

Gemma 3 ("gemma3", NeoX rotary: nothing permuted): llama.cpp's converter writes
its norm weights as 1 + weight; like transformers' GGUF loader we subtract the 1
again, round the weight to the model's dtype and keep 1 + it in float32
(gemma3_config.norm_weight); its header's extra fields are read by
inference.engine.gemma3_config.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from . import gemma3_config
from .model_config import ModelConfig, RopeScaling

if TYPE_CHECKING:  # torch is imported lazily: the tokenizer reads headers in processes that need no torch
    import torch

    from .packed_linear import Int4Groups, Int8Blocks, Q5Blocks

GGUF_MAGIC = b"GGUF"

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_NUMPY_TYPES = {
    GGUFValueType.UINT8: np.uint8, GGUFValueType.INT8: np.int8, GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16, GGUFValueType.UINT32: np.uint32, GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32, GGUFValueType.BOOL: np.bool_, GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64, GGUFValueType.FLOAT64: np.float64,
}

# Architectures whose Q/K rows llama.cpp permutes when converting from Hugging Face.
_PERMUTED_QK_ARCHITECTURES = {"llama"}
_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3",  # llama.cpp writes Mistral 7B as "llama"
                  "gemma3": "gemma3"}
_GEMMA_NORMS = {"attn_norm": "input_layernorm", "post_attention_norm": "attn_output_norm",
                "ffn_norm": "post_attention_layernorm", "post_ffw_norm": "mlp_output_norm"}  # llama.cpp's -> ours


class GGUFFormatError(ValueError):
    pass


class _Cursor:
    def __init__(self, buffer: mmap.mmap | bytes) -> None:
        self.buffer, self.pos = buffer, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        raw = self.buffer[self.pos:self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: GGUFValueType):
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            item_type = GGUFValueType(self.scalar("<I"))
            count = self.scalar("<Q")
            if item_type in _NUMPY_TYPES:
                dtype = np.dtype(_NUMPY_TYPES[item_type]).newbyteorder("<")
                values = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.pos)
                self.pos += count * dtype.itemsize
                return values.tolist()
            return [self.value(item_type) for _ in range(count)]
        return self.scalar(_SCALAR_FORMATS[vtype])


def read_gguf_header(path: str | Path) -> tuple[dict, dict[str, tuple[tuple[int, ...], int]]]:
    """(metadata, {tensor name: (torch-order shape, GGML type)}) without reading any tensor data."""
    with open(path, "rb") as handle:
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            if buffer[:4] != GGUF_MAGIC:
                raise GGUFFormatError(f"{path} is not a GGUF file")
            cursor = _Cursor(buffer)
            cursor.pos = 4
            version = cursor.scalar("<I")
            if version not in (2, 3):
                raise GGUFFormatError(f"{path}: unsupported GGUF version {version} (big-endian files are not supported)")
            tensor_count = cursor.scalar("<Q")
            kv_count = cursor.scalar("<Q")
            metadata: dict = {}
            for _ in range(kv_count):
                key = cursor.string()
                metadata[key] = cursor.value(GGUFValueType(cursor.scalar("<I")))
            tensors: dict[str, tuple[tuple[int, ...], int]] = {}
            for _ in range(tensor_count):
                name = cursor.string()
                dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
                ggml_type = cursor.scalar("<I")
                cursor.scalar("<Q")  # data offset
                tensors[name] = (tuple(reversed(dims)), ggml_type)  # GGUF lists dims innermost first
            return metadata, tensors


def read_gguf_metadata(path: str | Path) -> dict:
    """All key/value metadata of a GGUF file (arrays as lists), without reading tensor data."""
    return read_gguf_header(path)[0]


def read_gguf_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a GGUF file, from its header alone."""
    metadata, tensors = read_gguf_header(path)
    return config_from_gguf_metadata(metadata, set(tensors))


def config_from_gguf_metadata(metadata: dict, tensor_names: set[str]) -> ModelConfig:
    """The ModelConfig a GGUF's metadata and tensor names describe (the names decide tying and biases)."""
    arch = metadata.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise GGUFFormatError(f"unsupported GGUF architecture {arch!r}; supported: {sorted(_ARCHITECTURES)}")

    def key(name: str, default=None):
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise GGUFFormatError(f"GGUF metadata lacks {arch}.{name}")
        return value

    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") and arch != "gemma3":
        raise GGUFFormatError(f"rope scaling {scaling!r} is not supported")
    # Llama 3.1+: llama.cpp writes the "llama3" scaling as per-frequency divisors, read at load (rope.py)
    rope_scaling = RopeScaling() if "rope_freqs.weight" in tensor_names else None
    hidden = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    head_dim = int(metadata.get(f"{arch}.attention.key_length", hidden // num_heads))
    rope_dims = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise GGUFFormatError(f"partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab_size = int(metadata.get(f"{arch}.vocab_size") or (len(tokens) if tokens else 0))
    layers = int(key("block_count"))
    extra = {"rope_scaling": rope_scaling}
    if arch == "gemma3":
        extra = gemma3_config.fields_from_gguf(metadata, layers, hidden, num_heads, head_dim)
    return ModelConfig(
        architecture=_ARCHITECTURES[arch],
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
        **extra,
    )


def _with_rope_freqs(config: ModelConfig, source: _Tensors) -> ModelConfig:
    """`config` with the float32 values of the file's rope_freqs.weight (llama.cpp's llama3 divisors)."""
    import torch

    from .dequant import dequantize
    from .rope import with_freq_factors

    t = source.tensor("rope_freqs.weight")
    return with_freq_factors(config, dequantize(t.data, t.tensor_type, source.infos["rope_freqs.weight"][0],
                                                torch.float32))


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Invert llama.cpp's permutation of Q/K rows (interleaved rotary pairs -> rotate-half halves)."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *rest)
            .transpose(1, 2).reshape(rows, *rest).contiguous())


class _Tensors:
    """A GGUF file's tensors, read on demand in our layout: dequantised to `dtype`, or packed, with the Q/K
    rows llama.cpp permuted put back in rotate-half order (by the head count each getter is given)."""

    def __init__(self, path: str | Path, metadata: dict, infos: dict, dtype: torch.dtype) -> None:
        self.path, self.infos, self.dtype = path, infos, dtype
        self.permuted = metadata["general.architecture"] in _PERMUTED_QK_ARCHITECTURES
        self.tensors = {t.name: t for t in GGUFReader(str(path)).tensors}

    def tensor(self, name: str):
        found = self.tensors.get(name)
        if found is None:
            raise GGUFFormatError(f"{self.path}: tensor {name} is missing")
        return found

    def get(self, name: str, heads: int | None = None) -> torch.Tensor:
        from .dequant import dequantize

        t = self.tensor(name)
        value = dequantize(t.data, GGMLQuantizationType(t.tensor_type), self.infos[name][0], self.dtype)
        return unpermute_qk(value, heads) if heads and self.permuted else value

    def gemma_norm(self, name: str) -> torch.Tensor:
        """A Gemma norm weight (the file's 1 + weight) as gemma3_config.norm_weight keeps it: float32."""
        import torch

        from .dequant import dequantize

        t = self.tensor(name)
        stored = dequantize(t.data, GGMLQuantizationType(t.tensor_type), self.infos[name][0], torch.float32)
        return gemma3_config.norm_weight(stored - 1.0, self.dtype)

    def int4_groups(self, names: list[str], heads: list[int | None]) -> Int4Groups | None:
        """The exact 4-bit groups of `names` concatenated by rows, or None unless all are Q4_0/Q4_1/Q4_K."""
        from .dequant import int4_groups
        from .packed_linear import Int4Groups

        return self._gather(int4_groups, Int4Groups.cat, names, heads)

    def int8_groups(self, names: list[str], heads: list[int | None]) -> Int8Blocks | None:
        """The exact int8 blocks of `names` concatenated by rows, or None unless all are Q8_0/Q5_0/Q4_0 or all
        Q6_K (blocks of 32 and of 16 do not join)."""
        from .dequant import int8_blocks
        from .packed_linear import Int8Blocks

        return self._gather(int8_blocks, Int8Blocks.cat, names, heads)

    def q5_groups(self, names: list[str], heads: list[int | None]) -> Q5Blocks | None:
        """The Q5_0 bytes of `names` concatenated by rows, or None unless all are Q5_0 and the native kernel
        multiplies them here (kernels.q8_matmul_cpu.q5_supported)."""
        from kernels.q8_matmul_cpu import q5_supported

        from .dequant import q5_bytes
        from .packed_linear import Q5Blocks

        if not q5_supported():
            return None
        return self._gather(q5_bytes, Q5Blocks.cat, names, heads)

    def _gather(self, convert, cat, names: list[str], heads: list[int | None]):
        """`convert` of each tensor of a fused Linear, Q/K rows unpermuted, joined by `cat`; None if any is None."""
        parts = []
        for name, head_count in zip(names, heads):
            t = self.tensor(name)
            part = convert(t.data, GGMLQuantizationType(t.tensor_type), self.infos[name][0])
            if part is None:
                return None
            parts.append(part.map_rows(lambda x, h=head_count: unpermute_qk(x, h)) if head_count and self.permuted
                         else part)
        return cat(parts)

    def int8_blocks(self, name: str) -> Int8Blocks | None:
        """The exact int8 blocks of `name`, or None unless it is Q8_0/Q5_0/Q4_0/Q6_K."""
        from .dequant import int8_blocks

        t = self.tensor(name)
        return int8_blocks(t.data, GGMLQuantizationType(t.tensor_type), self.infos[name][0])


def _fused_linears(config: ModelConfig, i: int) -> dict[str, tuple[list[str], list[int | None]]]:
    """Layer `i`'s Linears -> their GGUF sources, with the head count to unpermute Q/K rows by."""
    blk, out = f"blk.{i}", f"layers.{i}"
    return {
        f"{out}.self_attn.qkv_proj": ([f"{blk}.attn_q", f"{blk}.attn_k", f"{blk}.attn_v"],
                                      [config.num_heads, config.num_kv_heads, None]),
        f"{out}.self_attn.o_proj": ([f"{blk}.attn_output"], [None]),
        f"{out}.mlp.gate_up_proj": ([f"{blk}.ffn_gate", f"{blk}.ffn_up"], [None, None]),
        f"{out}.mlp.down_proj": ([f"{blk}.ffn_down"], [None]),
    }


def _load_layer(source: _Tensors, config: ModelConfig, i: int, *, int4: bool, int8: bool,
                state: dict[str, torch.Tensor], packed: dict[str, Int4Groups | Int8Blocks | Q5Blocks]) -> None:
    """Add layer `i`'s parameters to `state`, and to `packed` its Linears held exactly as 4-bit groups (with
    `int4`) or, failing that, as int8 blocks (with `int8`)."""
    import torch

    blk, out = f"blk.{i}", f"layers.{i}"
    get = source.get
    for linear, (sources, heads) in _fused_linears(config, i).items():
        state[f"{linear}.weight"] = torch.cat([get(f"{s}.weight", h) for s, h in zip(sources, heads)])
        names = [f"{s}.weight" for s in sources]
        if int4 and (found := source.int4_groups(names, heads)) is not None:
            packed[linear] = found
        elif int8 and (blocks := source.q5_groups(names, heads) or source.int8_groups(names, heads)) is not None:
            packed[linear] = blocks
    if config.attention_bias:
        state[f"{out}.self_attn.qkv_proj.bias"] = torch.cat(
            (get(f"{blk}.attn_q.bias", config.num_heads), get(f"{blk}.attn_k.bias", config.num_kv_heads),
             get(f"{blk}.attn_v.bias")))
    norm = source.gemma_norm if config.gemma else get
    if config.qk_norm:  # Qwen3, Gemma 3 (llama.cpp does not permute their rows: NeoX rotary)
        state[f"{out}.self_attn.q_norm.weight"] = norm(f"{blk}.attn_q_norm.weight")
        state[f"{out}.self_attn.k_norm.weight"] = norm(f"{blk}.attn_k_norm.weight")
    norms = _GEMMA_NORMS if config.gemma else {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for theirs, ours in norms.items():
        state[f"{out}.{ours}.weight"] = norm(f"{blk}.{theirs}.weight")


def load_gguf(path: str | Path, *, dtype: torch.dtype, int4: bool = False, int8_head: bool = False,
              int8: bool = False) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Int4Groups | Int8Blocks | Q5Blocks]]:
    """(config, state_dict in LlamaForCausalLM's parameter names on the CPU in `dtype`, packed weights).

    With `int4`, the third item maps each Linear (e.g. "layers.0.mlp.gate_up_proj") whose source
    tensors are all Q4_0/Q4_1/Q4_K to its exact 4-bit groups (see packed_linear). With `int8_head`, it also
    maps "lm_head" to the exact int8 blocks of the output weight (the token embedding when tied) when
    that tensor is Q8_0/Q5_0/Q4_0/Q6_K. With `int8`, each other Linear whose sources are all Q5_0 maps to their
    bytes (Q5Blocks, where the native kernel takes them), else, all Q8_0/Q5_0/Q4_0 (or all Q6_K), to its exact
    int8 blocks. Otherwise it is empty.
    """
    metadata, infos = read_gguf_header(path)
    config = config_from_gguf_metadata(metadata, set(infos))
    source = _Tensors(path, metadata, infos, dtype)
    if config.rope_scaling is not None and config.rope_scaling.rope_type == "llama3":  # its per-frequency divisors
        config = _with_rope_freqs(config, source)

    state: dict[str, torch.Tensor] = {"embed_tokens.weight": source.get("token_embd.weight"),
                                      "norm.weight": (source.gemma_norm if config.gemma else source.get)(
                                          "output_norm.weight")}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = source.get("output.weight")
    packed: dict[str, Int4Groups | Int8Blocks | Q5Blocks] = {}
    if int8_head:
        head_name = "token_embd.weight" if config.tie_word_embeddings else "output.weight"
        if (blocks := source.int8_blocks(head_name)):
            packed["lm_head"] = blocks
    for i in range(config.num_layers):
        _load_layer(source, config, i, int4=int4, int8=int8, state=state, packed=packed)
    return config, state, packed
