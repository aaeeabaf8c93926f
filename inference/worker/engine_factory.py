"""Building an Engine from worker options and settings.

The engine and the kernels read no settings and no environment: their knobs are
EngineConfig fields and two process-wide configurations (kernels.dispatch.configure,
inference.engine.cpu_matmul.configure), filled here from platform_site/settings.py.
A setting left unset (None) keeps the engine's or the kernels' own default.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


def engine_runtime_configure() -> None:
    """Apply the settings of the kernels and of the CPU matmuls to this process (before a model loads)."""
    from inference.engine import cpu_matmul  # torch loads only in processes that build an engine
    from kernels.dispatch import configure

    configure(backend=settings.KERNELS_BACKEND, cpu_native=settings.KERNELS_CPU_NATIVE,
              cache_dir=settings.KERNELS_CACHE_DIR, cc=settings.KERNELS_CC, tune_malloc=settings.KERNELS_TUNE_MALLOC)
    cpu_matmul.configure(upcast=settings.ENGINE_CPU_UPCAST_MATMUL, prepack=settings.ENGINE_CPU_PREPACK)


def engine_build(
    *,
    model: str,
    device: str = "cpu",
    dtype: str | None = None,
    kv_cache_mb: int | None = None,
    kv_cache_fraction: float | None = None,
    workers_per_device: int | None = None,
    max_num_seqs: int | None = None,
    row_options: dict | None = None,
    **extra: Any,
) -> Any:
    """An Engine for `model` on `device` (a built-in name, or any ServedModel row's: its files are registered
    first); an argument left None takes the model's row's value (dtype) or its setting, a setting left None the
    engine's default. `row_options`: the row's engine options when the caller has read them already
    (run_worker: served_model_check, which registered the files too); else they are read here. The KV cache
    is sized from the device's free memory unless a size is given (the engine logs the size and its tokens;
    inference.engine.kv_sizing); a cache that cannot hold one max-length sequence raises KvCacheSizeError
    here, at start."""
    from inference.engine import Engine, EngineConfig  # torch loads only in processes that build an engine

    from inference.served_models import served_model_engine_setup

    engine_runtime_configure()
    if row_options is None:
        row_options = served_model_engine_setup(name=model)  # an added model's files, under its name
    options = {
        "dtype": dtype or row_options.get("dtype") or settings.ENGINE_DTYPE,
        "kv_cache_mb": kv_cache_mb or settings.ENGINE_KV_CACHE_MB,
        # `is None`, not `or`: a 0 asked for is refused by EngineConfig, not replaced by the default
        "kv_cache_fraction": settings.ENGINE_KV_CACHE_FRACTION if kv_cache_fraction is None else kv_cache_fraction,
        "workers_per_device": settings.ENGINE_WORKERS_PER_DEVICE if workers_per_device is None else workers_per_device,
        "free_memory_mb": settings.ENGINE_FREE_MEMORY_MB,
        "max_num_seqs": max_num_seqs or settings.ENGINE_MAX_NUM_SEQS,
        "background_priority": settings.BATCH_ENGINE_PRIORITY,  # the Batch API's lines (batches.runner)
        "speculative": settings.ENGINE_SPECULATIVE,
        "num_speculative_tokens": settings.ENGINE_NUM_SPECULATIVE_TOKENS,
    }
    options = {name: value for name, value in options.items() if value is not None}  # None: EngineConfig's default
    if "batch_invariant" not in extra:  # the operator's choice for this model (admin: Served models)
        options["batch_invariant"] = row_options["batch_invariant"]
    return Engine(EngineConfig(model=model, device=device, **options, **extra))
