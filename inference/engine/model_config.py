"""The architecture description every loader produces and the model consumes.

One shape for all supported families (Llama, Qwen2, Mistral, Qwen3): a Llama
decoder with grouped-query attention, RMSNorm, rotary embeddings and a SwiGLU
MLP. Qwen2 differs only by biases on the Q/K/V projections; Qwen3 by an RMSNorm
over each head of q and k before the rotary embedding (no biases), often with a
head_dim other than hidden_size / num_heads. Llama 3.1+ scales the rotary
frequencies (`RopeScaling`, computed by inference.engine.rope).

Gemma 3 ("gemma3") is the same decoder with Gemma's changes (inference.engine.llama
describes them): norms around both the attention and the MLP blocks, a GELU-tanh
MLP, q/k norms, embeddings scaled by sqrt(hidden_size), attention scaled by
query_pre_attn_scalar^-0.5, and local sliding-window layers (their own rotary
base, `rope_local_theta`, unscaled) interleaved with global ones (`rope_theta`,
with "linear" scaling on the larger models). `sliding_window` with
`sliding_layers` None (Mistral) makes every layer local.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral", "qwen3", "gemma3")
QK_NORM_ARCHITECTURES = ("qwen3", "gemma3")  # per-head RMSNorm of q and k before the rotary embedding
GEMMA_ARCHITECTURES = ("gemma3",)
ROPE_SCALING_TYPES = ("llama3", "linear")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3.x rotary scaling ("llama3"), as transformers' `_compute_llama3_parameters` applies it; or
    "linear" (Gemma 3's global layers): every inverse frequency divided by `factor`, nothing else set.

    From a Hugging Face config: factor, low_freq_factor, high_freq_factor and original_max_position_embeddings.
    From a GGUF: llama.cpp's per-frequency divisors (its `rope_freqs.weight` tensor), `freq_factors`; a config
    read from a GGUF's header alone has neither (the factors are in the tensor data, read at load).
    """

    rope_type: str = "llama3"
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(f"rope scaling {self.rope_type!r} is not supported (supported: {ROPE_SCALING_TYPES})")
        if self.rope_type == "linear":
            if self.factor is None or self.factor <= 0 or self.freq_factors is not None:
                raise ValueError(f"linear rope scaling needs a positive factor (only), got {self.factor}")
            return
        params = (self.factor, self.low_freq_factor, self.high_freq_factor, self.original_max_position_embeddings)
        if any(p is None for p in params) and any(p is not None for p in params):
            raise ValueError("llama3 rope scaling needs factor, low_freq_factor, high_freq_factor and "
                             f"original_max_position_embeddings, got {params}")
        if self.factor is not None and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
                             f"{self.high_freq_factor} <= {self.low_freq_factor}")

    @property
    def from_params(self) -> bool:
        return self.factor is not None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None  # tokens a local layer sees (its own included)
    sliding_layers: tuple[bool, ...] | None = None  # which layers are local; None: all (with sliding_window)
    rope_local_theta: float | None = None  # the local layers' rotary base (Gemma 3); None: rope_theta
    query_pre_attn_scalar: float | None = None  # attention scale ^-2 (Gemma); None: head_dim
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap) (Gemma)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {self.architecture!r}; supported: {SUPPORTED_ARCHITECTURES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.sliding_layers is not None and len(self.sliding_layers) != self.num_layers:
            raise ValueError(f"{len(self.sliding_layers)} layer types for {self.num_layers} layers")
        factors = self.rope_scaling.freq_factors if self.rope_scaling else None
        if factors is not None and len(factors) != self.head_dim // 2:
            raise ValueError(f"{len(factors)} rope frequency factors for head_dim {self.head_dim}")

    @property
    def qk_norm(self) -> bool:
        return self.architecture in QK_NORM_ARCHITECTURES

    @property
    def gemma(self) -> bool:
        return self.architecture in GEMMA_ARCHITECTURES

    def layer_window(self, layer: int) -> int:
        """Layer `layer`'s sliding window, 0 for a global layer."""
        if self.sliding_window is None or (self.sliding_layers is not None and not self.sliding_layers[layer]):
            return 0
        return self.sliding_window

    @property
    def kv_window(self) -> int:
        """How far back any layer reads the KV cache: the sliding window when every layer is local (Mistral),
        so blocks behind it can be given back (inference.engine.block_manager); 0 when a layer is global
        (Gemma 3: its global layers read every position, so nothing is freed)."""
        if self.sliding_window is None or (self.sliding_layers is not None and not all(self.sliding_layers)):
            return 0
        return self.sliding_window

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def context_length(self) -> int:
        return self.max_position_embeddings
