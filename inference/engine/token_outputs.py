"""A sampled token, handled in two halves, and a request ended by its own failure.

`take`: append the token, advance its grammar's matcher (structured outputs: a complete grammar ends
the request, "stop") and decide stop tokens and length limits (what the next schedule needs);
`emit`: its text delta, stop strings and RequestOutput. A synchronous step runs both; with
async_output the second half of a step's tokens runs during the next step. A sequence whose own
handling raises ends alone, with "error" (`fail`).
"""

from __future__ import annotations

import logging

from inference.engine.logprobs import LogprobFormatter
from inference.engine.outputs import RequestOutput, request_output
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence, SeqStatus

logger = logging.getLogger(__name__)

FINISHED = SeqStatus.FINISHED

# A taken token: (seq, token, sampled logprobs or None, output count, stopped by a stop token)
Taken = tuple


class TokenOutputs:
    """Takes sampled tokens into their sequences (finishing them in `scheduler`) and builds their
    outputs (logprobs through `logprob_formatter`)."""

    def __init__(self, scheduler: Scheduler, logprob_formatter: LogprobFormatter) -> None:
        self.scheduler = scheduler
        self.logprob_formatter = logprob_formatter

    def take(self, seq: Sequence, token: int, lp, now: float) -> Taken:
        """Append the token and decide stop tokens and length limits (finishing the request at once)."""
        out = seq.output_token_ids
        out.append(token)  # Sequence.append_token, inline: this runs for every sequence every step
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
        n_out = len(out)
        stopper = seq.stopper
        stop = stopper.check_token(token, n_out)
        if stop is not None:
            reason, seq.stop_reason = stop
            self.scheduler.finish(seq, reason)
        elif seq.grammar is not None and seq.grammar.accept(token):  # the grammar is complete (raises if refused)
            self.scheduler.finish(seq, "stop")
        elif stopper.check_length(n_out, len(seq.token_ids)):
            self.scheduler.finish(seq, "length")
        return seq, token, lp, n_out, stop is not None

    def take_all(self, seqs: list[Sequence], token_ids: list[int], lps, now: float,
                 outputs: list[RequestOutput]) -> list[Taken]:
        """`take` for each sampled row; a row that fails ends its request alone (into `outputs`)."""
        taken = []
        take = self.take
        for i, seq in enumerate(seqs):
            if seq.status is FINISHED:  # async_output: a late stop string or an abort; this token is dropped
                continue
            try:
                taken.append(take(seq, token_ids[i], None if lps is None else lps[i], now))
            except Exception as exc:  # noqa: BLE001 - this sequence's own failure ends it alone
                outputs.append(self.fail(seq, exc))
        return taken

    def take_run(self, seq: Sequence, tokens: list[int], lps, now: float) -> list[Taken]:
        """Take several tokens of one sequence (speculative decoding's kept drafts and the token after them),
        up to the one that finishes it; the rest are dropped (never emitted, never counted)."""
        run = []
        for i, token in enumerate(tokens):
            run.append(self.take(seq, token, None if lps is None else lps[i], now))
            if seq.status is FINISHED:
                break
        return run

    def emit_all(self, taken: list, now: float) -> list[RequestOutput]:
        """`emit` for each taken token (`emit_run` for a list of one sequence's tokens); one that fails
        (detokenizing, stop strings) ends its request alone."""
        outputs = []
        emit = self.emit
        for t in taken:
            try:
                outputs.append(self.emit_run(t, now) if t.__class__ is list else emit(t, now))
            except Exception as exc:  # noqa: BLE001
                outputs.append(self.fail(taken_seq(t), exc))
        return outputs

    def emit_run(self, run: list[Taken], now: float) -> RequestOutput:
        """One RequestOutput for several taken tokens of one sequence. A stop string found before the run's
        last token ends the request there: the tokens after it are taken back (never emitted or counted)."""
        seq = run[0][0]
        tokens, text, logprobs = [], "", []
        for i, t in enumerate(run):
            last = i == len(run) - 1
            out = self.emit(t, now, last=last)
            tokens.append(t[1])
            text += out.delta_text
            if out.logprobs:
                logprobs += out.logprobs
            if not last and isinstance(seq.stop_reason, str):  # a stop string: the rest of the run goes
                extra = len(run) - 1 - i
                del seq.output_token_ids[-extra:]
                del seq.token_ids[-extra:]
                break
        return request_output(seq, tokens, text, logprobs or None, now)

    def emit(self, taken: Taken, now: float, *, last: bool = True) -> RequestOutput:
        """Text delta and stop strings of a taken token, and its RequestOutput. A stop string in the
        text wins over a length limit reached by the same token. `last`: the last of its sequence's tokens
        this step (a finished sequence's detokenizer is flushed then)."""
        seq, token, lp, n_out, stopped_by_token = taken
        stopper = seq.stopper
        text, hit = "", None
        if not stopped_by_token:
            text, hit = stopper.feed(seq.detok.add(token), n_out)
            if hit is not None:
                seq.stop_reason = hit
                if seq.status is FINISHED:
                    seq.finish_reason = "stop"
                else:
                    self.scheduler.finish(seq, "stop")
        if hit is None and last and seq.status is FINISHED:  # flush what the detokenizer and stop checker hold
            tail, hit = stopper.feed(seq.detok.finish(), n_out)
            text += tail
            if hit is not None:
                seq.finish_reason, seq.stop_reason = "stop", hit
            else:
                text += stopper.flush()
        logprobs = [self.logprob_formatter.format(token, lp)] if lp is not None else None
        return request_output(seq, [token], text, logprobs, now)

    def fail(self, seq: Sequence, error: BaseException, *, log: bool = True) -> RequestOutput:
        """End one request with "error" (its blocks freed); its output says why. `log`: log the error
        with its traceback (not when the whole engine stopped: that is logged once)."""
        if seq.status is not FINISHED:
            self.scheduler.finish(seq, "error")
        seq.finish_reason = "error"
        if log:
            logger.error("request %s failed in the engine", seq.request_id, exc_info=error)
        out = request_output(seq, [], "", None)
        out.error = f"Engine error: {type(error).__name__}: {error}"
        return out


def taken_seq(taken) -> Sequence:
    """The sequence of a taken token, or of a run of them."""
    return taken[0][0] if taken.__class__ is list else taken[0]
