"""Build and load the native decoder stack (``kernels/csrc/decode_stack.cpp``), a PyTorch C++ operator library.

One call runs every layer of a Llama-family model for a few decode rows: the
kernels of ``kernels/csrc`` (taken by address from the library
``kernels.cpu_native`` loaded, so the very code the Python path calls) and
PyTorch's int4 matmul, in the Python path's order, so the result is the Python
path's bit for bit without its ~9 ms of per-op cost a step at batch 1
(docs/benchmarks/speculative.md). The model side (which weights, when it
applies) is inference/engine/native_stack.py.

The library is compiled at first use with the system C++ compiler against the
running torch's headers, into ``kernels.cpu_native.cache_dir()``; its file name
hashes the source, flags, compiler, torch version and this CPU's flags. Builds
are atomic (a temporary file renamed into place). ``load()`` returns False,
after one warning, when there is no C++ compiler, the build or load fails, the
native C library is unavailable, or ``cpu_native`` is configured off; callers
then keep the Python path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import torch

from kernels import cpu_native

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "decode_stack.cpp"
FLAGS = ("-O2", "-march=native", "-std=c++20", "-shared", "-fPIC", "-w")
# The kernels the stack calls, in the order decode_stack.cpp's `register` takes their addresses.
KERNELS = ("rms_norm_rows", "rotary_rows", "silu_and_mul_rows", "store_kv_rows", "paged_decode_attention")

_lock = threading.Lock()
_state: dict[str, bool] = {}


def find_compiler() -> str | None:
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return name
    return None


def _flags() -> list[str]:
    """FLAGS plus the running torch's headers, libraries and C++ ABI (what torch.utils.cpp_extension would give,
    without importing it: it pulls in setuptools, which a deployment need not have)."""
    root = Path(torch.__file__).resolve().parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]
    return [*FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}"]


def library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(_flags()).encode(), compiler.encode(), version.encode(),
                 torch.__version__.encode(), platform.machine().encode(), cpu_native._cpu_flags().encode()):
        key.update(part)
        key.update(b"\0")
    return cpu_native.cache_dir() / f"{SOURCE.stem}-{key.hexdigest()[:24]}.so"


def build(compiler: str, target: Path) -> None:
    cpu_native.compile_atomically(target, lambda tmp: [compiler, *_flags(), "-o", tmp, str(SOURCE), "-lc10",
                                                       "-ltorch_cpu"], timeout=600)


def _load_uncached() -> bool:
    if cpu_native.load() is None:
        return False  # the stack calls the C library's kernels
    compiler = find_compiler()
    try:
        if compiler is None:
            raise RuntimeError("no C++ compiler found (install g++)")
        path = library_path(compiler)
        if not path.exists():
            build(compiler, path)
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("native decoder stack unavailable, decode steps take the per-op path: %s", exc)
        return False
    return True


def load() -> bool:
    """Whether the operators ``torch.ops.llmp_decode_stack.*`` are loaded (built first if need be)."""
    if not cpu_native.enabled():
        return False
    try:
        return _state["loaded"]
    except KeyError:
        pass
    with _lock:
        if "loaded" not in _state:
            _state["loaded"] = _load_uncached()
        return _state["loaded"]


def kernel_addresses() -> list[int]:
    lib = cpu_native.load()
    return [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in KERNELS]


def register(weights: list[torch.Tensor], final_norm: torch.Tensor, windows: list[int], shape: list[int],
             eps: float, scale: float) -> int:
    """Keep a model's weights in the library -> its handle (``unregister`` lets them go). The stack's int4
    projections take the C library's int4 GEMM where kernels.int4_gemm_cpu does (same rows, same bits)."""
    from kernels import int4_gemm_cpu

    variant = int4_gemm_cpu.variant()
    int4 = [] if variant is None else [int4_gemm_cpu.address(), variant, int4_gemm_cpu.NATIVE_MIN_ROWS]
    return torch.ops.llmp_decode_stack.register(weights, final_norm, windows, shape, eps, scale, kernel_addresses(),
                                                int4)


PARTS = ("norms", "qkv", "rotary + K/V store", "attention", "o_proj", "gate_up", "activation", "down")


def profile(enable: bool) -> dict[str, float]:
    """Turn the stack's per-part timing on or off -> the seconds each part took since the last call (zeroed)."""
    return {part: ns / 1e9 for part, ns in zip(PARTS, torch.ops.llmp_decode_stack.profile(enable))}


def unregister(handle: int) -> None:
    torch.ops.llmp_decode_stack.unregister(handle)


def run(handle: int, hidden: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
        block_tables: torch.Tensor, seq_lens: torch.Tensor, cos_sin: torch.Tensor,
        k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], num_splits: int = 0) -> torch.Tensor:
    """hidden [T, H] -> the final hidden states; each row attends over its own block table row up to its own
    sequence length, in ``num_splits`` parts (0: the kernel's choice; 1: batch-invariant mode's)."""
    return torch.ops.llmp_decode_stack.run(handle, hidden, positions, slot_mapping, block_tables, seq_lens, cos_sin,
                                           k_caches, v_caches, num_splits)
