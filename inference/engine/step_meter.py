"""What the engine's steps did, counted: totals (`counters`), wall time per phase (`timers`) and the
token rates of the last few seconds. One `StepMeter` per engine, shared by its step order and its
step-failure handler; `Engine.stats()` reports it.
"""

from __future__ import annotations

from collections import deque

from inference.engine.scheduler import ScheduledBatch

RATE_WINDOW_S = 10.0


class StepMeter:
    def __init__(self) -> None:
        self.counters = {"steps": 0, "prompt_tokens": 0, "generated_tokens": 0}
        # Wall time per phase of step(); everything but model_s is engine overhead. take_s: appending the
        # sampled tokens and their stop-token / length checks (what the next schedule needs: with
        # async_output on a GPU, host time between two forwards, with schedule_s and prepare_s);
        # output_s: text deltas, stop strings, RequestOutputs (async_output: while the GPU runs).
        self.timers = {"schedule_s": 0.0, "prepare_s": 0.0, "model_s": 0.0, "sample_s": 0.0, "take_s": 0.0,
                       "output_s": 0.0}
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, prompt tokens, generated tokens)

    def count(self, batch: ScheduledBatch, num_sampled: int, now: float, *, generated: int | None = None) -> None:
        """A step of `batch` ran at `now` and sampled `num_sampled` rows, the rest being prompt tokens; it
        generated `generated` tokens (speculative decoding: the kept drafts and one more per drafting
        sequence; else one per sampled row)."""
        n_prompt = batch.num_tokens - num_sampled
        if generated is not None:
            num_sampled = generated
        self.counters["steps"] += 1
        self.counters["prompt_tokens"] += n_prompt
        self.counters["generated_tokens"] += num_sampled
        self._recent.append((now, n_prompt, num_sampled))
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()

    def rates(self) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s) over the last RATE_WINDOW_S seconds of steps."""
        recent = self._recent
        span = (recent[-1][0] - recent[0][0]) if len(recent) > 1 else 0.0
        prompt_rate = sum(r[1] for r in recent) / span if span > 0 else 0.0
        gen_rate = sum(r[2] for r in recent) / span if span > 0 else 0.0
        return prompt_rate, gen_rate
