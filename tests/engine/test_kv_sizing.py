"""The KV cache's size (inference.engine.kv_sizing): it follows the free memory, the fraction and the workers
sharing the device; the CPU caps; an explicit size wins; a cache too small for one max-length sequence, or a
size that does not fit, fails at start. Then the reading of the figures: the host's memory and a cgroup limit,
the bytes of the real model's weights, and an Engine over the real model sized from a given free figure."""

from __future__ import annotations

import pytest

from inference.engine.kv_sizing import (
    GiB, MiB, KvCacheSizeError, cpu_free_bytes, kv_cache_plan, weights_bytes,
)

BLOCK = 16
BLOCK_BYTES = 2 * 30 * BLOCK * 3 * 64 * 2  # SmolLM2-135M in bfloat16: 30 layers, 3 KV heads of 64
FIGURES = dict(block_bytes=BLOCK_BYTES, block_size=BLOCK, min_tokens=8192)


def plan(**figures):
    return kv_cache_plan(**{**FIGURES, **figures})


def test_the_size_follows_the_free_memory_the_fraction_and_the_workers():
    small = plan(free_bytes=4 * GiB, weights_bytes=300 * MiB, fraction=0.5)
    large = plan(free_bytes=8 * GiB, weights_bytes=300 * MiB, fraction=0.5)
    assert small.source == large.source == "free memory"
    assert small.num_blocks == (2 * GiB - 300 * MiB) // BLOCK_BYTES
    assert large.num_blocks == (4 * GiB - 300 * MiB) // BLOCK_BYTES
    assert small.bytes <= 2 * GiB - 300 * MiB < small.bytes + BLOCK_BYTES  # whole blocks, as much as fits
    assert small.tokens == small.num_blocks * BLOCK
    assert plan(free_bytes=8 * GiB, weights_bytes=300 * MiB, fraction=0.9).num_blocks == (
        int(8 * GiB * 0.9) - 300 * MiB) // BLOCK_BYTES
    # two workers on the device: each takes half the share, its own weights out of its half
    shared = plan(free_bytes=8 * GiB, weights_bytes=300 * MiB, fraction=0.5, workers=2)
    assert shared.num_blocks == small.num_blocks
    assert "over 2 workers" in shared.describe()


def test_the_caps_bind_and_say_so():
    free = dict(free_bytes=20 * GiB, weights_bytes=300 * MiB, fraction=0.5)
    by_sequences = plan(**free, max_tokens=4 * 8192)
    assert (by_sequences.num_blocks, by_sequences.tokens) == (4 * 8192 // BLOCK, 4 * 8192)
    assert "max_num_seqs x max_model_len" in by_sequences.source
    by_ceiling = plan(**free, max_tokens=64 * 8192, max_bytes=4 * GiB)
    assert by_ceiling.num_blocks == 4 * GiB // BLOCK_BYTES and "4 GiB" in by_ceiling.source
    assert plan(**free, max_tokens=10**9, max_bytes=10**15).source == "free memory"  # caps above the share


def test_an_explicit_size_wins_over_the_free_memory():
    explicit = plan(free_bytes=20 * GiB, weights_bytes=300 * MiB, fraction=0.5, override_bytes=96 * MiB,
                    max_bytes=4 * GiB)
    assert explicit.source == "kv_cache_mb"
    assert explicit.num_blocks == 96 * MiB // BLOCK_BYTES
    # below one max-length sequence is the operator's choice (long prompts get a 400), beyond the fraction too
    assert plan(free_bytes=600 * MiB, weights_bytes=300 * MiB, override_bytes=64 * MiB).num_blocks == (
        64 * MiB // BLOCK_BYTES)
    assert plan(free_bytes=600 * MiB, weights_bytes=300 * MiB, override_bytes=280 * MiB).num_blocks == (
        280 * MiB // BLOCK_BYTES)
    assert plan(override_bytes=64 * MiB).free_bytes is None  # no figure needed


def test_an_explicit_size_that_does_not_fit_fails():
    with pytest.raises(KvCacheSizeError, match="kv_cache_mb=400 does not fit: 600 MiB are free"):
        plan(free_bytes=600 * MiB, weights_bytes=300 * MiB, override_bytes=400 * MiB)


def test_no_room_for_one_max_length_sequence_fails_with_the_figures():
    with pytest.raises(KvCacheSizeError) as caught:
        plan(free_bytes=900 * MiB, weights_bytes=300 * MiB, fraction=0.5)
    message = str(caught.value)
    assert "one 8192-token sequence (180 MiB)" in message
    assert "0.5 of the 900 MiB free is 450 MiB" in message and "weights take 300 MiB" in message
    assert "kv_cache_mb" in message  # what to do about it
    with pytest.raises(KvCacheSizeError, match="/ 4 workers"):  # enough alone, not as one of four
        plan(free_bytes=2 * GiB, weights_bytes=300 * MiB, fraction=0.5, workers=4)
    with pytest.raises(KvCacheSizeError):  # weights larger than the share
        plan(free_bytes=500 * MiB, weights_bytes=300 * MiB, fraction=0.5)
    assert plan(free_bytes=2 * GiB, weights_bytes=300 * MiB, fraction=0.5, workers=2).num_blocks >= 8192 // BLOCK


def test_bad_figures_are_refused():
    for bad in (dict(fraction=0.0), dict(fraction=1.5), dict(workers=0)):
        with pytest.raises(ValueError):
            plan(free_bytes=GiB, **bad)
    with pytest.raises(ValueError, match="free_bytes"):
        plan()


# ---------------------------------------------------------------- the figures, read
def test_the_hosts_free_memory_is_read():
    total = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    free = cpu_free_bytes()
    assert 0 < free <= total


def write(folder, **files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_a_cgroup_v2_limit_lowers_the_figure(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   30000000 kB\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("0::/workers/w1\n")
    root = tmp_path / "fs"
    write(root / "workers" / "w1", memory_max=str(4 * GiB), memory_current=str(3 * GiB),
          memory_stat=f"anon {2 * GiB}\ninactive_file {GiB // 2}\n")
    # 4 GiB limit, 3 GiB charged of which 0.5 GiB is reclaimable file cache: 1.5 GiB of room
    assert cpu_free_bytes(meminfo=meminfo, cgroup_root=root, proc_cgroup=proc_cgroup) == 3 * GiB // 2
    (root / "workers" / "w1" / "memory.max").write_text("max\n")
    assert cpu_free_bytes(meminfo=meminfo, cgroup_root=root, proc_cgroup=proc_cgroup) == 30000000 * 1024
    # a limit on a cgroup above this one binds too
    write(root / "workers", memory_max=str(8 * GiB), memory_current=str(7 * GiB), memory_stat="inactive_file 0\n")
    assert cpu_free_bytes(meminfo=meminfo, cgroup_root=root, proc_cgroup=proc_cgroup) == GiB


def test_a_cgroup_v1_limit_lowers_the_figure(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   30000000 kB\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n")
    root = tmp_path / "fs"
    write(root / "memory" / "docker" / "abc", memory_limit_in_bytes=str(2 * GiB),
          memory_usage_in_bytes=str(GiB), memory_stat="total_inactive_file 0\n")
    assert cpu_free_bytes(meminfo=meminfo, cgroup_root=root, proc_cgroup=proc_cgroup) == GiB
    # no limit: v1 writes 2**63 rounded down to a page
    (root / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cpu_free_bytes(meminfo=meminfo, cgroup_root=root, proc_cgroup=proc_cgroup) == 30000000 * 1024


def test_the_weights_bytes_of_the_real_model(engine_model_f32):
    model = engine_model_f32.model
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    assert parameters > 100 * MiB  # 135M parameters in float32 (tied embeddings counted once)
    assert parameters <= weights_bytes(model) <= 2 * parameters  # plus any packed copies


def test_an_engine_sizes_its_cache_from_the_free_figure_and_an_explicit_size_wins(make_engine):
    # the shared weights are already loaded: nothing of them comes out of the figure
    engine = make_engine(kv_cache_mb=None, free_memory_mb=1200, kv_cache_fraction=0.5)
    per_block = engine.kv_plan.block_bytes
    assert engine.kv_plan.source == "free memory"
    assert engine.block_manager.num_blocks == 600 * MiB // per_block == engine.kv_plan.num_blocks
    assert engine.runner.kv_caches[0][0].shape[0] == engine.kv_plan.num_blocks
    stats = engine.stats()
    assert (stats["kv_cache_bytes"], stats["kv_cache_tokens"]) == (engine.kv_plan.bytes, engine.kv_plan.tokens)
    larger = make_engine(kv_cache_mb=None, free_memory_mb=1600, kv_cache_fraction=0.5)
    assert larger.kv_plan.num_blocks == 800 * MiB // per_block
    explicit = make_engine(kv_cache_mb=48, free_memory_mb=1200)
    assert (explicit.kv_plan.source, explicit.kv_plan.num_blocks) == ("kv_cache_mb", 48 * MiB // per_block)
    with pytest.raises(KvCacheSizeError, match="one 8192-token sequence"):
        make_engine(kv_cache_mb=None, free_memory_mb=500, kv_cache_fraction=0.5)
