"""system_fingerprint's parts: the weights by content (not by modification time), the kernel set with what
decides its numbers (the CPU's flags for torch's kernels, torch's threads outside batch-invariant mode)."""

from __future__ import annotations

import os

import torch

from inference.engine.fingerprint import SAMPLE_BYTES, kernel_set, system_fingerprint, weights_identity


def test_the_weights_identity_follows_their_bytes_not_their_mtime(tmp_path):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF" + bytes(3 * SAMPLE_BYTES))
    before = weights_identity(weights)
    os.utime(weights, ns=(1, 1))  # copied elsewhere, or touched: the same weights
    assert weights_identity(weights) == before
    data = bytearray(weights.read_bytes())
    data[-5] = 1  # a tensor at the end changed, same size
    weights.write_bytes(bytes(data))
    tail_changed = weights_identity(weights)
    assert tail_changed != before
    data[10] = 1  # the header too
    weights.write_bytes(bytes(data))
    assert weights_identity(weights) not in (before, tail_changed)


def test_torch_kernels_name_the_cpu_and_the_threads_outside_the_invariant_mode():
    threads = torch.get_num_threads()
    plain = kernel_set("ref", torch.device("cpu"))
    assert "cpu-flags=" in plain and f"threads={threads}" in plain
    assert "threads=" not in kernel_set("ref", torch.device("cpu"), batch_invariant=True)
    try:
        torch.set_num_threads(threads + 1)
        assert kernel_set("ref", torch.device("cpu")) != plain
    finally:
        torch.set_num_threads(threads)


def test_the_fingerprint_changes_with_the_mode(tmp_path):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF")
    common = dict(weights=weights, dtype=torch.bfloat16, device=torch.device("cpu"), backend="ref")
    assert system_fingerprint(**common, batch_invariant=False) != system_fingerprint(**common, batch_invariant=True)
