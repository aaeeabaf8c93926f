"""Building and loading the native decoder stack (kernels/decode_stack_cpu.py): where it cannot be had, the
engine keeps the per-op path with one warning, never an error; tests/engine/test_native_stack.py checks what it
computes."""

from __future__ import annotations

import logging

import pytest

from kernels import cpu_native, decode_stack_cpu


@pytest.fixture
def fresh_stack(monkeypatch):
    monkeypatch.setattr(decode_stack_cpu, "_state", {})


def test_no_cxx_compiler_means_the_per_op_path_and_a_warning(fresh_stack, monkeypatch, caplog):
    if cpu_native.load() is None:
        pytest.skip("the native C library did not build here")
    monkeypatch.setattr(decode_stack_cpu, "find_compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger="kernels.decode_stack_cpu"):
        assert decode_stack_cpu.load() is False
        assert decode_stack_cpu.load() is False  # decided once
    warnings = [r for r in caplog.records if "native decoder stack unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0].getMessage()


def test_configured_off_it_is_never_built(fresh_stack, kernel_config, monkeypatch):
    kernel_config(cpu_native=False)
    monkeypatch.setattr(decode_stack_cpu, "build", lambda *a: pytest.fail("built while configured off"))
    assert decode_stack_cpu.load() is False


def test_without_the_c_library_it_is_not_loaded(fresh_stack, monkeypatch):
    monkeypatch.setattr(cpu_native, "load", lambda: None)
    monkeypatch.setattr(decode_stack_cpu, "build", lambda *a: pytest.fail("built without the kernels it calls"))
    assert decode_stack_cpu.load() is False


def test_a_failed_build_is_a_warning(fresh_stack, kernel_config, tmp_path, monkeypatch, caplog):
    if cpu_native.load() is None or decode_stack_cpu.find_compiler() is None:
        pytest.skip("no native C library or C++ compiler here")
    kernel_config(cache_dir=tmp_path)
    monkeypatch.setattr(decode_stack_cpu, "FLAGS", (*decode_stack_cpu.FLAGS, "-DLLMP_BREAK=1", "-include",
                                                    str(tmp_path / "missing.h")))
    with caplog.at_level(logging.WARNING, logger="kernels.decode_stack_cpu"):
        assert decode_stack_cpu.load() is False
    assert any("failed" in r.getMessage() for r in caplog.records)
    assert not list(tmp_path.glob("decode_stack-*.so"))  # nothing half-built left to load


def test_the_library_name_follows_the_source_and_torch(monkeypatch):
    compiler = decode_stack_cpu.find_compiler()
    if compiler is None:
        pytest.skip("no C++ compiler here")
    first = decode_stack_cpu.library_path(compiler)
    monkeypatch.setattr(decode_stack_cpu.torch, "__version__", "0.0.0-other")
    assert decode_stack_cpu.library_path(compiler) != first
