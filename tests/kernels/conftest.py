"""Device selection for the Triton tests: CPU through Triton's interpreter at small
shapes (hosts without a GPU; tests/conftest.py switches the interpreter on), CUDA
with compiled kernels at real shapes when a GPU is present."""

from __future__ import annotations

import os

import pytest
import torch

from kernels import cpu_native
from kernels._triton import HAS_TRITON, interpreter_active

HAS_CUDA = torch.cuda.is_available()


def _skip_reason(device: str) -> str | None:
    if not HAS_TRITON:
        return "triton is not installed"
    if device == "cuda":
        if not HAS_CUDA:
            return "no CUDA device on this host: the compiled-kernel tests at real shapes need a GPU"
        if interpreter_active():
            return "TRITON_INTERPRET=1 is set, so kernels were built for the interpreter, not CUDA"
        return None
    if not interpreter_active():
        if os.environ.get("TRITON_INTERPRET") == "1":
            pytest.fail("TRITON_INTERPRET=1 was set after triton was imported; set it earlier")
        return "Triton interpreter is off (a GPU host); the CUDA variants cover these kernels"
    return None


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> str:
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    return request.param


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path, kernel_config):
    """kernels.cpu_native with an empty load cache and its own cache directory (builds with a test's compiler)."""
    monkeypatch.setattr(cpu_native, "_loaded", {})
    monkeypatch.setattr(cpu_native, "_warned", False)
    kernel_config(cache_dir=tmp_path)
    return tmp_path
