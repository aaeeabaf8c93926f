"""Building an Engine from worker options and settings."""

from __future__ import annotations

from typing import Any


def engine_build(
    *,
    model: str,
    device: str = "cpu",
    dtype: str | None = None,
    kv_cache_mb: int | None = None,
    max_num_seqs: int | None = None,
    **extra: Any,
) -> Any:
    from django.conf import settings

    from inference.engine import Engine, EngineConfig

    options = {
        "model": model,
        "device": device,
        "dtype": dtype or settings.ENGINE_DTYPE,
        "kv_cache_mb": kv_cache_mb or settings.ENGINE_KV_CACHE_MB,
        "max_num_seqs": max_num_seqs or getattr(settings, "ENGINE_MAX_NUM_SEQS", 64),
        **extra,
    }
    return Engine(EngineConfig(**options))
