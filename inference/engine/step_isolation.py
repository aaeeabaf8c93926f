"""A step that raised: find the request(s) that made it fail, so that only they end.

A step runs the model on every scheduled sequence and samples the rows that are
due, all in one batch, so an exception does not say whose it is. The batch is
bisected: each half runs again on its own (prepare, forward, sampling), and a
half that raises is split again, until every failing part is one sequence: the
culprits. A sequence's inputs, K/V slots and sampling state do not depend on
the other rows, so a part that runs writes the same K/V and samples the tokens
the sequence would have got in the whole batch (up to the row-count dependence
of the numerics, the batch-invariance caveat). The forwards that failed wrote
at most the K/V of this step's own new tokens, which the rerun writes again.

A part of one sequence that raises is run once more before it is blamed (a
batch of one that fails is retried once). The sampling draw is the last thing
a launch does, so a failure before it leaves a seeded request's generator
where it was.

`StepFailureHandler` is the engine's collaborator that does this when a step raises, and decides
when the device is broken (`dead`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from inference.engine.model_runner import ModelRunner
from inference.engine.outputs import RequestOutput
from inference.engine.sampler import Sampler
from inference.engine.scheduler import ScheduledBatch, Scheduler
from inference.engine.sequence import Sequence
from inference.engine.spec_step import drop_drafts
from inference.engine.step_meter import StepMeter
from inference.engine.token_outputs import TokenOutputs

logger = logging.getLogger(__name__)

# Steps in a row that ran nothing (every scheduled request failed alone) before the device is taken
# to be broken, when each of them held a single request (two or more failing alone at once suffice).
DEAD_AFTER_FAILED_STEPS = 3


class EngineDeadError(RuntimeError):
    """The engine stopped working (every request failed alone in the same step): it takes no requests."""


@dataclass(slots=True)
class IsolatedStep:
    """What the bisection ran: the sequences whose forward ran (with their scheduled token counts),
    the tokens of those that sampled, and the culprits with their errors."""

    ran: list[tuple[Sequence, int]] = field(default_factory=list)
    sampled: list[tuple[Sequence, int, object]] = field(default_factory=list)  # (seq, token, logprobs or None)
    failed: list[tuple[Sequence, BaseException]] = field(default_factory=list)


def step_isolate(*, runner, sampler, seqs: list[Sequence], num_new_tokens: list[int]) -> IsolatedStep:
    """Rerun a failed step's batch in parts until each failure is pinned to one sequence."""
    result = IsolatedStep()
    _bisect(runner, sampler, list(seqs), list(num_new_tokens), result)
    return result


def _bisect(runner, sampler, seqs: list[Sequence], nums: list[int], result: IsolatedStep) -> None:
    mid = len(seqs) // 2
    for part, part_nums in ((seqs[:mid], nums[:mid]), (seqs[mid:], nums[mid:])):
        if not part:
            continue
        try:
            _run(runner, sampler, part, part_nums, result)
        except Exception as exc:  # noqa: BLE001 - any failure is pinned, whatever its kind
            if len(part) == 1:
                result.failed.append((part[0], exc))
            else:
                _bisect(runner, sampler, part, part_nums, result)


def _run(runner, sampler, seqs: list[Sequence], nums: list[int], result: IsolatedStep) -> None:
    sampling, logits = runner.run(*runner.prepare(seqs, nums))
    sampled = sampler(logits, sampling) if sampling else None
    result.ran.extend(zip(seqs, nums))  # only once the whole part ran: a part that raised is retried
    if sampled is not None:
        lps = sampled.logprobs
        result.sampled.extend(
            (seq, token, None if lps is None else lps[i]) for i, (seq, token) in enumerate(zip(sampling, sampled.token_ids)))


class StepFailureHandler:
    """What a step does when it raises. The culprits end with "error" and their blocks are freed; when
    nothing of a step runs (two requests or more, or DEAD_AFTER_FAILED_STEPS steps in a row), the
    device is taken to be broken: every request ends once and `dead` says why.

    It reruns parts of a batch with `runner` and `sampler`, ends requests in `scheduler` through
    `tokens` (which also takes the tokens of the parts that ran) and counts the step in `meter`."""

    def __init__(self, *, scheduler: Scheduler, runner: ModelRunner, sampler: Sampler, tokens: TokenOutputs,
                 meter: StepMeter) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.sampler = sampler
        self.tokens = tokens
        self.meter = meter
        self.dead: str | None = None  # why the engine stopped taking requests (a broken device), if it did
        self.failed_steps = 0  # steps in a row whose every scheduled request failed alone

    def step_ran(self) -> None:
        """A step ran (some of it at least): the count of failed steps in a row starts again."""
        if self.failed_steps:
            self.failed_steps = 0

    def recover(self, batch: ScheduledBatch, error: BaseException) -> list[RequestOutput]:
        """The step of `batch` raised `error` before its tokens were taken: rerun it in parts
        (step_isolate), end the culprits with "error", take the others' tokens."""
        if not batch.seqs:
            return []
        logger.warning("engine step of %d requests failed (%s: %s); isolating the cause",
                       len(batch.seqs), type(error).__name__, error)
        drop_drafts(batch)  # speculative decoding: the parts run again without their drafts
        result = step_isolate(runner=self.runner, sampler=self.sampler, seqs=batch.seqs,
                              num_new_tokens=batch.num_new_tokens)
        tokens = self.tokens
        outputs = [tokens.fail(seq, exc) for seq, exc in result.failed]
        if result.failed and not result.ran:
            self.failed_steps += 1
            if len(result.failed) > 1 or self.failed_steps >= DEAD_AFTER_FAILED_STEPS:
                return outputs + self.die(result.failed[-1][1])
        elif result.ran:
            self.failed_steps = 0
        self.scheduler.postprocess(ScheduledBatch([s for s, _ in result.ran], [n for _, n in result.ran]))
        now = time.time()
        sampled = result.sampled
        taken = tokens.take_all([s for s, _, _ in sampled], [t for _, t, _ in sampled],
                                [lp for _, _, lp in sampled], now, outputs)
        outputs += tokens.emit_all(taken, now)
        self.meter.count(batch, len(sampled), now)
        return outputs

    def die(self, error: BaseException) -> list[RequestOutput]:
        """The device is broken: end every request once, take no more. (The step order drops the
        steps it holds in flight.)"""
        self.dead = f"the engine stopped after a step failed for every request in it ({type(error).__name__}: {error})"
        logger.critical("%s; ending the %d requests it holds", self.dead, len(self.scheduler.requests))
        dead = EngineDeadError(self.dead)
        return [self.tokens.fail(seq, dead, log=False) for seq in list(self.scheduler.requests.values())]
