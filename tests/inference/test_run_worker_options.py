"""run_worker's step-order flags: what EngineConfig gets from them."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from inference.engine import EngineConfig
from inference.management.commands.run_worker import Command, step_order


def _parse(*argv: str) -> dict:
    options = vars(Command().create_parser("manage.py", "run_worker").parse_args(list(argv)))
    return step_order(sync_output=options["sync_output"], async_scheduling=options["async_scheduling"])


@pytest.mark.parametrize("argv,async_output,async_scheduling", [
    ((), None, False),  # async scheduling is opt-in (not yet run on a GPU); deferred outputs stay the CUDA default
    (("--async-scheduling",), None, True),
    (("--no-async-scheduling",), None, False),
    (("--sync-output",), False, False),
])
def test_flags_set_the_engine_step_order(argv, async_output, async_scheduling):
    order = _parse(*argv)
    assert order == {"async_output": async_output, "async_scheduling": async_scheduling}
    config = EngineConfig(device="cuda", **order)
    assert config.async_scheduling is async_scheduling


def test_sync_output_with_async_scheduling_is_refused():
    with pytest.raises(CommandError, match="contradict"):
        _parse("--sync-output", "--async-scheduling")


def test_engine_config_defaults_to_synchronous_scheduling():
    assert EngineConfig().async_scheduling is False


def test_engine_config_refuses_async_scheduling_with_synchronous_outputs():
    with pytest.raises(ValueError, match="contradict"):
        EngineConfig(async_output=False, async_scheduling=True)
    assert EngineConfig(async_output=True, async_scheduling=True).async_scheduling
