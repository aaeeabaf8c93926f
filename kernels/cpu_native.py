"""Build and load the native CPU kernels (``kernels/csrc/*.c``) through ctypes.

The C sources are compiled at first use with the system C compiler
(``kernels.config``'s ``cc``, else ``cc``/``gcc``/``clang``) into a shared
library under the cache directory (``cache_dir``, default
``~/.cache/llm-platform/kernels``). The file
name is a hash of the source, the flags, the compiler's version and this CPU's
feature flags, since ``-march=native`` code must never be loaded on another CPU
that shares the cache. Builds go to a temporary file that is renamed into
place, so processes building at once never load a half-written library.

``load()`` returns None, after logging one warning, when there is no compiler,
the build or the load fails, or ``cpu_native`` is configured off; callers then
use the PyTorch references.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from kernels.config import current

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode_attention.c"
# Built into the same library (kernels/fused_ops_cpu.py, q8_matmul_cpu.py, fixed_matmul_cpu.py and int4_gemm_cpu.py
# bind their functions).
EXTRA_SOURCES = tuple(Path(__file__).with_name("csrc") / name
                      for name in ("fused_ops.c", "q8_matmul.c", "q8_gemm.c", "fixed_matmul.c", "int4_gemm.c"))
# Included by those sources: part of the library's cache key, so editing one rebuilds the library.
HEADERS = (Path(__file__).with_name("csrc") / "bf16.h",)
# -fno-trapping-math lets GCC if-convert (and so vectorise) loops with clamps.
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-std=gnu11", "-shared", "-fPIC")
ABI_VERSION = 4  # 2: the sliding window argument; 3: rms_norm_rows' weight_f32, q8_matmul's block and output dtype;
# 4: q5_matmul

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_warned = False


def enabled() -> bool:
    return current().cpu_native


def cache_dir() -> Path:
    configured = current().cache_dir
    return configured if configured is not None else Path.home() / ".cache" / "llm-platform" / "kernels"


def find_compiler() -> str | None:
    configured = (current().cc or "").strip()
    if configured:
        return shutil.which(configured.split()[0]) and configured
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def _cpu_flags() -> str:
    """This CPU's feature flags (Linux); elsewhere the best description there is."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86, arm64
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def library_path(compiler: str, source: bytes) -> Path:
    """Where the library built from ``source`` with ``compiler`` on this CPU lives."""
    version = subprocess.run(
        [*compiler.split(), "--version"], capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    key = hashlib.sha256()
    for part in (source, *(extra.read_bytes() for extra in (*EXTRA_SOURCES, *HEADERS)), " ".join(FLAGS).encode(), compiler.encode(), version.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"{SOURCE.stem}-{key.hexdigest()[:24]}.so"


def compile_atomically(target: Path, argv, timeout: int = 300) -> None:
    """Run the compiler command ``argv(tmp)`` (which writes its output to ``tmp``), then rename ``tmp`` to
    ``target``: processes building at once never load a half-written library. Also used by kernels.decode_stack_cpu."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.stem + ".", suffix=".tmp")
    os.close(fd)
    try:
        command = argv(tmp)
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{command[0]} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(compiler: str, source_path: Path, target: Path) -> None:
    """Compile ``source_path`` into ``target`` atomically (temp file, then rename)."""
    compile_atomically(target, lambda tmp: [*compiler.split(), *FLAGS, "-o", tmp, str(source_path),
                                            *map(str, EXTRA_SOURCES), "-lm"])


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("native CPU kernels unavailable, using the PyTorch references: %s", message)


def _load_uncached() -> ctypes.CDLL | None:
    compiler = find_compiler()
    if compiler is None:
        _warn_once("no C compiler found (set CC, or install gcc)")
        return None
    try:
        source = SOURCE.read_bytes()
        path = library_path(compiler, source)
        if not path.exists():
            build(compiler, SOURCE, path)
        # torch is imported first, so the library's libgomp.so.1 resolves to torch's
        # copy: one OpenMP runtime and one thread pool for both.
        lib = ctypes.CDLL(str(path))
        if lib.paged_decode_attention_abi_version() != ABI_VERSION:
            raise RuntimeError(f"{path} has ABI {lib.paged_decode_attention_abi_version()}, want {ABI_VERSION}")
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
        _warn_once(str(exc))
        return None
    fn = lib.paged_decode_attention
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [
        ptr, i64, i64,  # q, its batch and head strides (elements)
        ptr, ptr,  # k_cache, v_cache
        i64, i64, i64,  # num_blocks, block_size, num_kv_heads
        ptr, i64, i64,  # block_tables, its row stride, max blocks per sequence
        ptr, ptr,  # seq_lens, out
        i64, i64, i64,  # batch, num_heads, head_dim
        ctypes.c_float, ctypes.c_int, i64, ctypes.c_int,  # scale, dtype code, num_splits, threads
        i64,  # window (0: none)
    ]
    fn.restype = ctypes.c_int
    return lib


def load() -> ctypes.CDLL | None:
    """The native kernel library, built if needed; None when unavailable (see module doc)."""
    if not enabled():
        return None
    try:
        return _loaded["lib"]  # the per-op fast path: no lock once loaded (a dict read is atomic)
    except KeyError:
        pass
    with _lock:
        if "lib" not in _loaded:
            _loaded["lib"] = _load_uncached()
        return _loaded["lib"]


def load_bound(bind) -> ctypes.CDLL | None:
    """`load()`, with `bind(lib)` (a module's ctypes signatures) applied once per loaded library. The binders
    applied are kept on the library object itself: a table keyed by id(lib) let a library loaded after another
    was freed take its id and skip its signatures (ctypes then passed int64 arguments as C ints: CI of
    2026-12-05)."""
    lib = load()
    if lib is None:
        return None
    binders = lib.__dict__.setdefault("_llmp_binders", set())
    if bind not in binders:
        bind(lib)
        binders.add(bind)
    return lib


def library_name() -> str | None:
    """The loaded library's file name (its build identity: sources, flags, compiler, CPU); None if unavailable."""
    lib = load()
    return None if lib is None else Path(lib._name).name


def available() -> bool:
    return load() is not None
