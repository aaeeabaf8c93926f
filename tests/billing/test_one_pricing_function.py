"""One function prices a request (billing.services.costs.usage_cost, on billing.money's one rule): this test reads
the product's Python files (their syntax trees, not their text) and fails where another module computes a cost.

- the cost arithmetic (token counts times the price terms' pico-dollars or a tier's multiplier) is billing.money's;
- the rule itself (`cost_compute`) is called by the pricing function, and by admission's worst-case bound of a
  reservation (the same rule applied to the most a request may use, before it runs: not a request's cost);
- the pricing function (`usage_cost`) is called by billing only: where a request ends (settlement.ending_make,
  which the worker calls) and the read-side fallbacks for a record given without its price (costs.usage_rows_cost,
  admission_settle.record_actual). The worker, the API and the metrics never price.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("billing", "inference", "batches", "tenants", "dashboard", "common", "platform_site", "kernels")
PRICE_FIELDS = {"input_picos", "cached_input_picos", "output_picos", "multiplier_milli"}
ARITHMETIC = {"billing/money.py"}
RULE_CALLERS = {"billing/services/costs.py", "billing/services/admission_plan.py"}
PRICING_CALLERS = {"billing/services/costs.py", "billing/services/settlement.py", "billing/services/admission_settle.py"}


def product_modules() -> dict[str, ast.AST]:
    modules = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            modules[path.relative_to(ROOT).as_posix()] = ast.parse(path.read_text(), filename=str(path))
    return modules


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _names_in(node: ast.AST) -> set[str]:
    return {name for child in ast.walk(node) if (name := _name(child)) is not None}


def price_arithmetic(tree: ast.AST) -> list[int]:
    """Lines that multiply by a price term or a tier multiplier."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
            and (_names_in(node.left) | _names_in(node.right)) & PRICE_FIELDS]


def calls_to(tree: ast.AST, function: str) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and _name(node.func) == function]


def test_the_scan_sees_the_pricing_it_allows():
    """The rules find what they look for (a scan that sees nothing would pass for nothing)."""
    modules = product_modules()
    assert price_arithmetic(modules["billing/money.py"])
    assert calls_to(modules["billing/services/costs.py"], "cost_compute")
    assert calls_to(modules["billing/services/settlement.py"], "usage_cost")
    assert price_arithmetic(ast.parse("cost = tokens * terms.output_picos * 1000"))
    assert calls_to(ast.parse("from billing.services import costs\ncosts.usage_cost(model='m')"), "usage_cost")


def test_no_other_module_computes_a_cost():
    found = []
    for path, tree in product_modules().items():
        if path not in ARITHMETIC:
            found += [f"{path}:{line}: price arithmetic" for line in price_arithmetic(tree)]
        if path not in RULE_CALLERS:
            found += [f"{path}:{line}: calls cost_compute" for line in calls_to(tree, "cost_compute")]
        if path not in PRICING_CALLERS:
            found += [f"{path}:{line}: calls usage_cost (price where the request ends: "
                      f"billing.services.settlement.ending_make)" for line in calls_to(tree, "usage_cost")]
    assert not found, "a request's cost is computed outside its one pricing function:\n" + "\n".join(found)
