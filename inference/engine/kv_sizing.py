"""The KV cache's size, chosen at start from the memory the device has free (as vLLM's
`gpu_memory_utilization` does) unless a size is given.

A worker's share is `fraction` of the memory free before its weights load (the host's RAM on the CPU:
MemAvailable, or what its cgroup limit leaves if that is less; one GPU's free memory on CUDA), divided
among the `workers` that share the device. Its weights come out of that share, the KV cache takes the
rest. What the fraction leaves is for everything else: the web processes (the same process in the
embedded mode), PostgreSQL and Redis on a one-box install, activations and the allocator's peaks. The
defaults are 0.9 on CUDA (vLLM's) and 0.5 on the CPU, where the memory is shared with all of that.

On the CPU the default is capped twice, since the memory is shared with everything else on the host: at
what `max_num_seqs` sequences of `max_model_len` tokens can use (vLLM's bound; more could never be
touched), and at 4 GiB (vLLM's CPU default, VLLM_CPU_KVCACHE_SPACE); a larger cache is asked for with
`kv_cache_mb`. A CPU cache costs nothing at start: it is an anonymous memory map whose zero pages the
kernel commits as blocks are first written (kv_cache.allocate_kv_caches; torch.zeros wrote every byte,
about 2.6 s per GiB on a 2-core VM), so the process's memory grows with the blocks in use up to the cap.
CUDA keeps the whole share (a larger cache keeps more prefixes), as vLLM does.

A cache too small for one `max_model_len` sequence fails the start (KvCacheSizeError, with the figures),
instead of refusing long prompts, or running out of memory, later. An explicit size (`kv_cache_mb`) wins;
it fails the start only when it and the weights exceed all the free memory.

A model whose every layer is windowed (inference.engine.block_manager) holds only its window's blocks per
sequence: both figures above count what it can hold (`sequence_kv_tokens`), plus its reserved null block.

`kv_cache_plan` is the whole decision, a pure function of those figures; `free_memory_bytes` and
`weights_bytes` read them from the device and the loaded model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch

MiB = 2**20
GiB = 2**30
DEFAULT_FRACTION = {"cpu": 0.5, "cuda": 0.9}
CPU_CEILING_BYTES = 4 * GiB


class KvCacheSizeError(RuntimeError):
    """The KV cache this engine needs does not fit the memory it may use."""


@dataclass(frozen=True, slots=True)
class KvCachePlan:
    num_blocks: int
    block_size: int
    block_bytes: int
    source: str  # what decided the size: kv_cache_mb, num_kv_blocks, free memory, or the cap that bound it
    free_bytes: int | None = None  # memory free before the weights (None: not read)
    weights_bytes: int = 0
    fraction: float | None = None
    workers: int = 1

    @property
    def bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    def describe(self) -> str:
        text = f"{self.bytes / MiB:.0f} MiB, {self.tokens} tokens ({self.num_blocks} blocks of {self.block_size})"
        if self.free_bytes is None:
            return f"{text}; set by {self.source}"
        share = "" if self.fraction is None else f", {self.fraction:g} of it"
        per = f" over {self.workers} workers" if self.workers > 1 else ""
        return (f"{text}; set by {self.source} ({self.free_bytes / MiB:.0f} MiB free{share}{per}, "
                f"weights {self.weights_bytes / MiB:.0f} MiB)")


def kv_cache_plan(*, block_bytes: int, block_size: int, min_tokens: int, free_bytes: int | None = None,
                  weights_bytes: int = 0, fraction: float = 0.5, workers: int = 1, max_tokens: int | None = None,
                  max_bytes: int | None = None, override_bytes: int | None = None) -> KvCachePlan:
    """How many blocks the cache gets.

    `free_bytes`: memory free on the device before this engine's weights load; `weights_bytes`: what they
    take (0 when they were already loaded, so already out of `free_bytes`); `min_tokens`: what the cache
    must hold at least (one max_model_len sequence); `max_tokens` / `max_bytes`: caps of the default;
    `override_bytes`: an explicit size (kv_cache_mb), which wins. Raises KvCacheSizeError when the
    chosen size does not fit.
    """
    if block_bytes <= 0 or block_size <= 0:
        raise ValueError("block_bytes and block_size must be positive")
    if override_bytes is not None:
        num_blocks = override_bytes // block_bytes
        if num_blocks < 1:
            raise KvCacheSizeError(f"kv_cache_mb={override_bytes / MiB:g} holds no {block_bytes}-byte block")
        if free_bytes is not None and num_blocks * block_bytes + weights_bytes > free_bytes:
            raise KvCacheSizeError(
                f"kv_cache_mb={override_bytes // MiB} does not fit: {free_bytes // MiB} MiB are free and the "
                f"weights take {math.ceil(weights_bytes / MiB)} MiB of them")
        return KvCachePlan(num_blocks, block_size, block_bytes, "kv_cache_mb", free_bytes, weights_bytes)
    if free_bytes is None:
        raise ValueError("free_bytes is needed without an explicit size")
    if not 0 < fraction <= 1 or workers < 1:
        raise ValueError("fraction must be in (0, 1] and workers at least 1")
    share = int(free_bytes * fraction) // workers
    room = share - weights_bytes
    num_blocks, source = max(room, 0) // block_bytes, "free memory"
    if max_tokens is not None and -(-max_tokens // block_size) < num_blocks:
        num_blocks, source = -(-max_tokens // block_size), "the cap of max_num_seqs x max_model_len tokens"
    if max_bytes is not None and max_bytes // block_bytes < num_blocks:
        num_blocks, source = max_bytes // block_bytes, f"the CPU cap of {max_bytes / GiB:g} GiB"
    need = -(-min_tokens // block_size)
    if num_blocks < need:
        per = f" / {workers} workers" if workers > 1 else ""
        raise KvCacheSizeError(
            f"no room for a KV cache of one {min_tokens}-token sequence ({need * block_bytes / MiB:.0f} MiB): "
            f"{fraction:g} of the {free_bytes / MiB:.0f} MiB free{per} is {share / MiB:.0f} MiB, and the weights "
            f"take {weights_bytes / MiB:.0f} MiB of it. Free memory, raise the KV-cache fraction, lower "
            f"max_model_len, or set kv_cache_mb")
    return KvCachePlan(num_blocks, block_size, block_bytes, source, free_bytes, weights_bytes, fraction, workers)


# ---------------------------------------------------------------- reading the figures
def free_memory_bytes(device: torch.device) -> int:
    """Memory free on `device` now: CUDA's free memory, or on the CPU the host's MemAvailable, lowered
    to what this process's cgroup limit leaves when one is set."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return cpu_free_bytes()


def cpu_free_bytes(*, meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup"),
                   proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """MemAvailable, or the room under a cgroup memory limit if less (v2 memory.max, v1
    memory.limit_in_bytes, of this process's cgroup or one above it; the room is the limit less the
    usage, less its inactive file cache, which the kernel reclaims before it kills: the working set, as
    the kubelet counts it)."""
    available = None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
            break
    if available is None:
        raise RuntimeError(f"no MemAvailable in {meminfo}")
    room = _cgroup_room(cgroup_root, proc_cgroup)
    return available if room is None else min(available, room)


def _cgroup_room(root: Path, proc_cgroup: Path) -> int | None:
    """The least room under a memory limit of this process's cgroup or of one above it (None: no limit)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    v2, v1 = "/", "/"
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    rooms = []
    for base, path, files in ((root, v2, ("memory.max", "memory.current", "inactive_file")),
                              (root / "memory", v1, ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                     "total_inactive_file"))):
        folder = base / path.strip("/")
        while True:
            room = _limit_room(folder, *files)
            if room is not None:
                rooms.append(room)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(rooms) if rooms else None


def _limit_room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        limit = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as 2**63 - 1 rounded down to a page
        return None
    inactive = 0
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return max(int(limit) - (usage - inactive), 0)


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of every tensor the model holds: parameters, buffers, and the packed or prepacked copies
    kept as plain attributes (inference.engine.packed_linear), each storage counted once."""
    seen: set[int] = set()
    total = 0

    def add(value) -> None:
        nonlocal total
        if hasattr(value, "__dataclass_fields__"):  # Int4Groups, Int8Blocks
            for name in value.__dataclass_fields__:
                add(getattr(value, name))
            return
        if not isinstance(value, torch.Tensor) or value.device.type == "meta":
            return
        try:
            storage = value.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # opaque layouts (oneDNN-blocked copies)
            key, size = id(value), value.numel() * value.element_size()
        if key not in seen:
            seen.add(key)
            total += size

    for module in model.modules():
        for value in (*module.parameters(recurse=False), *module.buffers(recurse=False), *vars(module).values()):
            add(value)
    return total


def sequence_kv_tokens(model_config, *, block_size: int, max_model_len: int, chunk: int) -> int:
    """The KV tokens one max_model_len sequence holds at most: all of them, or with every layer windowed its
    window, a prefill chunk of `chunk` tokens and two blocks (block_manager.peak_blocks)."""
    from .block_manager import peak_blocks

    return block_size * peak_blocks(max_model_len, block_size=block_size, window=model_config.kv_window,
                                    chunk=chunk)


def engine_kv_plan(config, model_config, *, device: torch.device, dtype: torch.dtype, max_model_len: int,
                   free_bytes: int | None, weights: int) -> KvCachePlan:
    """The plan for an Engine (inference.engine.EngineConfig's kv_cache_mb, num_kv_blocks, kv_cache_fraction,
    workers_per_device; `free_bytes` read before its weights loaded, `weights` what they took)."""
    from .kv_cache import kv_bytes_per_block

    block_bytes = kv_bytes_per_block(model_config, config.block_size, dtype)
    if config.num_kv_blocks is not None:
        return KvCachePlan(config.num_kv_blocks, config.block_size, block_bytes, "num_kv_blocks")
    on_cpu = device.type == "cpu"
    fraction = config.kv_cache_fraction or DEFAULT_FRACTION.get(device.type, DEFAULT_FRACTION["cuda"])
    one, most = max_model_len, config.max_num_seqs * max_model_len
    if model_config.kv_window:  # blocks behind the window are given back: the null block and windows
        bs, budget = config.block_size, config.max_num_batched_tokens
        held = functools.partial(sequence_kv_tokens, model_config, block_size=bs, max_model_len=max_model_len)
        one = held(chunk=budget) + bs
        # each decode holds its window; a step's prefill chunks add at most its token budget and a block each
        most = config.max_num_seqs * (held(chunk=1) + bs) + budget + bs
    return kv_cache_plan(
        block_bytes=block_bytes, block_size=config.block_size, min_tokens=one, free_bytes=free_bytes,
        weights_bytes=weights, fraction=fraction, workers=config.workers_per_device,
        max_tokens=most if on_cpu else None,
        max_bytes=CPU_CEILING_BYTES if on_cpu else None,
        override_bytes=None if config.kv_cache_mb is None else config.kv_cache_mb * MiB)


def engine_free_bytes(config, device: torch.device) -> int | None:
    """What an Engine sizes its cache from: config.free_memory_mb when set, else the device's free memory
    now (before the weights load); None with num_kv_blocks, which needs no figure."""
    if config.num_kv_blocks is not None:
        return None
    if config.free_memory_mb is not None:
        return config.free_memory_mb * MiB
    return free_memory_bytes(device)
