"""The inference engine (pure PyTorch; imports nothing from Django).

Names are imported lazily so that `import inference.engine.tokenizer` (what the
web process needs) does not load the model code.
"""

from __future__ import annotations

_EXPORTS = {
    "Engine": "inference.engine.engine",
    "EngineConfig": "inference.engine.config",
    "SamplingParams": "inference.engine.sampling_params",
    "EngineValidationError": "inference.engine.sampling_params",
    "PromptTooLongError": "inference.engine.sampling_params",
    "EngineDeadError": "inference.engine.step_isolation",
    "KvCacheSizeError": "inference.engine.kv_sizing",
    "RequestOutput": "inference.engine.outputs",
    "Usage": "inference.engine.outputs",
    "Timing": "inference.engine.outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inference.engine' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
