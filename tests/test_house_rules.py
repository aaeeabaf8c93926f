"""The house rules a reader relies on (issue 36): no product module over 400 lines, no function over 60
(a Triton kernel's body aside: it is one GPU program, and splitting it would cost registers, not lines).

Product modules: every .py file of the project's packages, not tests, benchmarks or migrations."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("batches", "billing", "common", "dashboard", "inference", "kernels", "platform_site", "tenants")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                  if "migrations" not in path.parts)


def _is_triton_kernel(node: ast.AST) -> bool:
    for decorator in getattr(node, "decorator_list", []):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name in ("jit", "autotune"):  # `triton.jit`, or kernels._triton's `jit` (triton's, or a stand-in)
            return True
    return False


def test_the_packages_are_found():
    assert len(_modules()) > 100  # a wrong root would make the checks below pass on nothing


def test_no_module_is_over_400_lines():
    long = {str(path.relative_to(ROOT)): lines for path in _modules()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by what they hold: {long}"


def test_no_function_is_over_60_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_triton_kernel(node):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, f"split these into named steps: {long}"


def test_a_triton_kernel_is_recognised_by_its_decorator():
    kernel = ast.parse("@triton.jit\ndef k(x):\n    pass\n").body[0]
    autotuned = ast.parse("@triton.autotune(configs=[])\n@triton.jit\ndef k(x):\n    pass\n").body[0]
    ours = ast.parse("@jit(do_not_specialize=['n'])\ndef k(x):\n    pass\n").body[0]
    plain = ast.parse("@functools.cache\ndef f(x):\n    pass\n").body[0]
    assert all(map(_is_triton_kernel, (kernel, autotuned, ours))) and not _is_triton_kernel(plain)
