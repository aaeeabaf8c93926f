"""Engine configuration: one slotted dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

_DTYPES = ("float32", "bfloat16", "float16")


def check_step_order(async_output: bool | None, async_scheduling: bool | None) -> None:
    """Async scheduling builds a step's outputs while the next step runs: it cannot have synchronous
    outputs (async_output=False). A ValueError when both are asked for (async_scheduling=None with
    async_output=False means no async scheduling)."""
    if async_scheduling and async_output is False:
        raise ValueError("async_scheduling (--async-scheduling) and async_output=False (--sync-output) "
                         "contradict each other: async scheduling defers outputs")


def resolve_step_order(device_type: str, async_output: bool | None,
                       async_scheduling: bool | None) -> tuple[bool, bool]:
    """(async_output, async_scheduling) in force on a device: an unset one is on for CUDA and off for the CPU,
    where nothing overlaps; async scheduling is never on with synchronous outputs."""
    on_cuda = device_type == "cuda"
    deferred = async_output if async_output is not None else on_cuda
    ahead = async_scheduling if async_scheduling is not None else on_cuda and deferred
    return deferred, ahead


@dataclass(slots=True)
class EngineConfig:
    model: str = "smollm2-135m-instruct"
    device: str = "cpu"
    dtype: str = "bfloat16"
    # KV cache size (inference.engine.kv_sizing): kv_cache_mb wins; unset, kv_cache_fraction (None: 0.5 on the
    # CPU, 0.9 on CUDA) of the memory free before the weights load (free_memory_mb when given, else read
    # from the device), shared by workers_per_device processes, less the weights; the CPU default is
    # capped at max_num_seqs x max_model_len tokens and 4 GiB. Too small for one max_model_len sequence:
    # KvCacheSizeError at start.
    kv_cache_mb: int | None = None
    kv_cache_fraction: float | None = None
    workers_per_device: int = 1
    free_memory_mb: int | None = None
    block_size: int = 16
    max_num_seqs: int = 64  # cap on running sequences
    max_num_batched_tokens: int = 1024  # per-step token budget (decodes + prefill chunks)
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # None: the model's context length
    num_kv_blocks: int | None = None  # overrides kv_cache_mb (tests use tiny budgets)
    # Starvation guards. A request preempted this many times is no longer chosen as a
    # victim while others are; a waiting request gains one priority level per
    # `priority_aging_s` seconds since arrival (None turns aging off). 0 preemptions: no bound.
    max_preemptions: int = 2
    priority_aging_s: float | None = 30.0
    # Background work (the Batch API's lines): requests at this priority or worse sit out every step that
    # prefills a foreground request, so its first token does not wait behind them. None: no background.
    background_priority: int | None = None
    seed: int = 0  # seeds the generator of requests without their own seed
    num_threads: int | None = None  # torch intra-op threads on CPU; None keeps torch's default
    # CUDA: replay decode-only steps as CUDA graphs at a ladder of batch sizes, all captured
    # at start-up; False runs them eagerly (debugging). Ignored on the CPU.
    cuda_graphs: bool = True
    # Deferred outputs: a step's text deltas, stop-string checks and RequestOutputs are built
    # while the GPU runs the next step (returned by the next step() call, one step later).
    # None: on for CUDA, off for the CPU (where nothing would overlap).
    async_output: bool | None = None
    # Async scheduling: the next step is scheduled, prepared and launched while the GPU still runs
    # this one, its decode inputs taken on the device from this step's sampled tokens; this step's
    # tokens are then read back, checked and turned into outputs while the next one computes (so
    # it implies deferred outputs). A request that finishes has had one more step launched for it,
    # whose token is dropped. None: on for CUDA (unless async_output=False), off for the CPU, where
    # nothing would overlap. The CUDA default follows its measurement (BENCHMARKS.md, "Engine on the
    # GPU": its batch-256 decode step 1.21x faster than deferred outputs alone on an H100, same call) and its
    # CUDA test against the synchronous engine.
    async_scheduling: bool | None = None
    # Batch-invariant mode: a request's tokens do not depend on the other requests of its steps
    # (inference.engine.invariant_mode); its cost is in BENCHMARKS.md. None (the default): on where it costs
    # little, i.e. where the default kernels are already the mode's (invariant_mode.invariant_default: a bf16
    # Q4 model on a CPU without 16-bit GEMM hardware), off elsewhere; the engine's config then holds the answer.
    batch_invariant: bool | None = None
    # CUDA: replay prompt and mixed steps (up to max_num_batched_tokens tokens) as piecewise CUDA graphs
    # around eager attention, at a ladder of token counts captured at start-up (inference.engine.prefill_graphs);
    # False runs them eagerly. Ignored on the CPU and in batch-invariant mode.
    prefill_graphs: bool = True
    # CUDA, compute capability 8.9+ (H100), bfloat16: the decoder's linear layers in fp8 E4M3 with per-channel
    # scales (inference.engine.fp8_linear; fp8_lm_head: the LM head too). Opt-in: it changes the tokens.
    fp8_weights: bool = False
    fp8_lm_head: bool = False
    # Speculative decoding (inference.engine.ngram_proposer): "ngram" drafts up to num_speculative_tokens tokens
    # per decoding sequence by prompt lookup (its last spec_ngram_max..spec_ngram_min tokens found earlier in
    # its own tokens) and verifies them in the step's one forward, while the step's decodes and drafts stay
    # within speculative_max_rows rows (None: 8 on the CPU, whose few-row kernels stop paying past that,
    # 256 on CUDA; larger steps are compute-bound). Greedy tokens are the same as without it (float32; in
    # 16-bit a row's rounding may depend on the step's row count, as batching's does), sampled ones come
    # from the same distribution. Not with async scheduling. "off": none. 3 drafts: a drafting sequence
    # fills the 4-row pass of the CPU's packed kernels (BENCHMARKS.md).
    speculative: str = "off"
    num_speculative_tokens: int = 3
    spec_ngram_min: int = 2
    spec_ngram_max: int = 4
    speculative_max_rows: int | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is required")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a positive power of two")
        if self.kv_cache_mb is not None and self.kv_cache_mb <= 0:
            raise ValueError("kv_cache_mb must be positive")
        if self.kv_cache_fraction is not None and not 0 < self.kv_cache_fraction <= 1:
            raise ValueError("kv_cache_fraction must be in (0, 1]")
        if self.workers_per_device < 1:
            raise ValueError("workers_per_device must be at least 1")
        if self.free_memory_mb is not None and self.free_memory_mb <= 0:
            raise ValueError("free_memory_mb must be positive")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError("num_kv_blocks must be at least 2")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (one decode token each)")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.max_preemptions < 0:
            raise ValueError("max_preemptions must be >= 0")
        if self.priority_aging_s is not None and self.priority_aging_s <= 0:
            raise ValueError("priority_aging_s must be positive or None")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be positive")
        check_step_order(self.async_output, self.async_scheduling)
        if self.batch_invariant and self.dtype == "float16" and not self.device.startswith("cuda"):
            raise ValueError("batch_invariant on the CPU takes bfloat16 or float32 (its native matmul has no float16)")
        if self.speculative not in ("off", "ngram"):
            raise ValueError(f"speculative must be 'off' or 'ngram', got {self.speculative!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")
        if self.speculative_max_rows is not None and self.speculative_max_rows < 2:
            raise ValueError("speculative_max_rows must be at least 2")
        if not 1 <= self.spec_ngram_min <= self.spec_ngram_max:
            raise ValueError("spec_ngram_min and spec_ngram_max need 1 <= min <= max")
        if self.speculative != "off" and self.async_scheduling:
            raise ValueError("speculative decoding does not run with async_scheduling (--async-scheduling)")
        if (self.fp8_weights or self.fp8_lm_head) and (self.batch_invariant or self.dtype != "bfloat16"):
            raise ValueError("fp8_weights / fp8_lm_head take a bfloat16 model and no batch_invariant mode")

    @property
    def torch_dtype(self):
        import torch

        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]
