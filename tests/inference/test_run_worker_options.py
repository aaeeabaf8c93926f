"""run_worker's step-order flags: what EngineConfig gets from them."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from inference.engine import EngineConfig
from inference.engine.config import resolve_step_order
from inference.management.commands.run_worker import Command, step_order


def _parse(*argv: str) -> dict:
    options = vars(Command().create_parser("manage.py", "run_worker").parse_args(list(argv)))
    return step_order(sync_output=options["sync_output"], async_scheduling=options["async_scheduling"])


@pytest.mark.parametrize("argv,async_output,async_scheduling,on_cuda,on_cpu", [
    # unset: the device decides (CUDA: deferred outputs and async scheduling, measured on a GPU; CPU: neither)
    ((), None, None, (True, True), (False, False)),
    (("--async-scheduling",), None, True, (True, True), (False, True)),
    (("--no-async-scheduling",), None, False, (True, False), (False, False)),
    (("--sync-output",), False, None, (False, False), (False, False)),
])
def test_flags_set_the_engine_step_order(argv, async_output, async_scheduling, on_cuda, on_cpu):
    order = _parse(*argv)
    assert order == {"async_output": async_output, "async_scheduling": async_scheduling}
    config = EngineConfig(device="cuda", **order)
    assert config.async_scheduling is async_scheduling
    assert resolve_step_order("cuda", **order) == on_cuda
    assert resolve_step_order("cpu", **order) == on_cpu


def test_sync_output_with_async_scheduling_is_refused():
    with pytest.raises(CommandError, match="contradict"):
        _parse("--sync-output", "--async-scheduling")


def test_engine_config_leaves_the_step_order_to_the_device():
    assert EngineConfig().async_scheduling is None
    assert resolve_step_order("cpu", None, None) == (False, False)
    assert resolve_step_order("cuda", None, None) == (True, True)


def test_engine_config_refuses_async_scheduling_with_synchronous_outputs():
    with pytest.raises(ValueError, match="contradict"):
        EngineConfig(async_output=False, async_scheduling=True)
    assert EngineConfig(async_output=True, async_scheduling=True).async_scheduling
