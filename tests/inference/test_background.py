"""OnePerKey: at most one background task per key; a failure is logged and frees the key."""

import asyncio
import contextlib
import logging

from inference.api.background import OnePerKey


async def test_one_task_per_key_at_a_time_and_a_failure_frees_the_key(caplog):
    tasks = OnePerKey("reloading")
    runs: list[str] = []
    gate = asyncio.Event()

    async def work(name: str) -> None:
        runs.append(name)
        await gate.wait()
        raise RuntimeError("database gone")

    tasks.start("a", lambda: work("a"))
    tasks.start("a", lambda: work("a-again"))  # in flight: not started
    tasks.start("b", lambda: work("b"))
    await asyncio.sleep(0)
    assert runs == ["a", "b"] and set(tasks) == {"a", "b"}
    gate.set()
    with caplog.at_level(logging.WARNING, logger="inference.api.background"):
        await asyncio.gather(*list(tasks.values()))
    assert not tasks  # each task removed itself
    assert [r.getMessage() for r in caplog.records] == ["reloading a failed", "reloading b failed"]
    gate.clear()
    tasks.start("a", lambda: work("a"))  # the next start runs again
    await asyncio.sleep(0)
    assert runs == ["a", "b", "a"]
    task = tasks["a"]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not tasks
