"""Structured outputs in the engine: grammars compiled off the engine thread, a matcher per sequence.

A request whose SamplingParams carry a `structured_output` (inference.engine.structured_spec) waits in
`StructuredGate` until its grammar is compiled, and only then enters the scheduler: the engine's step never
waits for a compile, and a sequence is never scheduled without its matcher. (The other choice, a sequence in
the scheduler that is skipped until its grammar is ready, would put a test into every schedule of every
sequence.) Compiles run in `GrammarCompiler`'s thread pool; llguidance drops the GIL while it builds. A
compile has a time bound (`timeout_s`: the request ends with "error" when it passes) on top of llguidance's
own fuel limits, which bound the build (about a second at worst on this machine) and every later mask.

Compiled grammars are cached (LRU, `cache_size` entries) under the canonical schema (compact JSON in the
schema's key order, which is the output's: StructuredOutput.key) with the tokenizer: a compiler belongs to
one engine and its tokenizer. The cache holds a matcher in its initial state; a request gets a copy (15 µs).
Failures are cached too: a hostile schema sent again fails at once (`add_request` raises
EngineValidationError).

Each step the sampler fills a token bitmask for the rows with a matcher and masks their logits before
any other filter (inference.engine.structured_mask); `TokenOutputs.take` advances the matcher with the
sampled token, and a matcher that has reached the end of its grammar ends the request ("stop"). EOS is in
the mask only where the grammar accepts. Preemption (recompute) keeps the matcher: the tokens generated
so far stay the sequence's, so the matcher's state is still theirs.

Library: llguidance 1.9.1, chosen over xgrammar 0.2.8 by benchmarks/grammar_compile.py on SmolLM2's
tokenizer (2-core CPU, 20 runs of each of 11 typical schemas + json_object; a batch of 64 rows, 200 steps):

                         xgrammar 0.2.8                     llguidance 1.9.1
  compile cold p50/p95   288 ms / 533 ms                    0.79 ms / 1.11 ms   (schema -> first mask)
  worst typical schema   573 ms p95 (bounded strings);      1.2 ms
                         1.9 s for a number in [0, 1]
  warm (cached) p50/p95  0.012 / 0.031 ms                   0.015 / 0.026 ms
  mask fill, 64 rows     0.49 ms p50, 11.8 ms p95           2.1 ms p50, 3.2 ms p95
  advance 64 matchers    0.31 ms p50                        0.31 ms p50
  keywords it cannot     ignored silently (uniqueItems,     an error naming them (uniqueItems, not,
  enforce                not, if/then/else, allOf, a        if/then/else), or ignored on request
                         pattern's maxLength); valid        (strict false: llguidance's lenient mode)
                         patternProperties refused
  hostile schemas        no bound on compile time           fuel limits on the build and on each mask

xgrammar's typical mask is 4x cheaper, but its compile time (hundreds of ms for ordinary Pydantic models,
seconds for some, unbounded for a hostile one) and its silent gaps decide: a request must not wait that long
for its grammar, and a client must hear which keywords are not enforced. llguidance's 2 ms for 64 rows is
about 1-2% of a CPU step at that batch (benchmarks/structured_decode.py), host work that overlaps the
GPU's forward there (the masks are filled once the forward is launched).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from inference.engine.outputs import RequestOutput, request_output
from inference.engine.sampling_params import EngineValidationError
from inference.engine.sequence import Sequence, SeqStatus
from inference.engine.structured_spec import PARAM, StructuredOutput, grammar_error

logger = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256
_ROUND_TRIP = 'Ünïcode {"naïve": "日本語 🙂", "n": [1, -2.5e3], "ok": true}\n\tend'


class GrammarViolation(RuntimeError):
    """A sampled token the grammar refuses (the mask should have made it impossible)."""


class GrammarState:
    """One sequence's matcher. `accept`: advance with a taken token; True once the grammar is complete."""

    __slots__ = ("matcher",)

    def __init__(self, matcher) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> bool:
        matcher = self.matcher
        if not matcher.consume_token(token):
            raise GrammarViolation(f"token {token} is outside the grammar: {matcher.get_error()[:300]}")
        return matcher.is_stopped()


def llguidance_tokenizer(tokenizer, vocab_size: int):
    """llguidance's view of our tokenizer: each id's raw bytes (byte-level BPE tokens unmapped from their
    GPT-2 spelling by Tokenizer.token_bytes_table), ids past the tokenizer's vocabulary (a padded lm_head)
    empty, so never allowed, and special tokens special (never inside a string; EOS only where the grammar
    accepts). A round trip checks that llguidance decodes our ids to our text."""
    import llguidance

    class Wrapped:  # what llguidance.TokenizerWrapper reads
        def __init__(self) -> None:
            table = tokenizer.token_bytes_table()
            self.tokens = list(table[:vocab_size]) + [b""] * max(0, vocab_size - len(table))
            self.eos_token_id, self.bos_token_id = tokenizer.eos_token_id, tokenizer.bos_token_id
            self.special_token_ids = sorted(set(tokenizer.all_special_ids) | set(tokenizer.skipped_special_ids))

        def __call__(self, text):
            return tokenizer.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

    ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()), n_vocab=vocab_size)
    ids = tokenizer.encode(_ROUND_TRIP)
    if ll.decode_bytes(ids) != tokenizer.decode(ids, skip_special_tokens=False).encode("utf-8"):
        raise EngineValidationError("response_format is not supported for this model's tokenizer", PARAM)
    return ll


class GrammarCompiler:
    """Compiles structured-output specs in a thread pool, caches the results (LRU). Used from the engine
    thread only (`submit`); the pool threads only build."""

    def __init__(self, tokenizer, vocab_size: int, *, cache_size: int = CACHE_SIZE, threads: int = 2) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar-compile")
        self._ll_tokenizer: Future | None = None

    def submit(self, spec: StructuredOutput) -> Future:
        """A future of the compiled template matcher (done at once on a cache hit)."""
        key = spec.key
        future = self._cache.get(key)
        if future is not None:
            self._cache.move_to_end(key)
            return future
        if self._ll_tokenizer is None:  # built once, in the pool (0.2 s for a 49k vocabulary)
            self._ll_tokenizer = self._pool.submit(llguidance_tokenizer, self.tokenizer, self.vocab_size)
        future = self._pool.submit(self._compile, spec)
        self._cache[key] = future
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return future

    def _compile(self, spec: StructuredOutput):
        import llguidance
        import llguidance.torch as lt

        # the matcher validates the grammar as it builds it (check()'s errors, from the same text)
        grammar = spec.grammar()
        try:
            matcher = llguidance.LLMatcher(self._ll_tokenizer.result(), grammar, log_level=0)
            if not matcher.is_error():  # the first mask builds the lexer (llguidance is lazy), finds empty grammars
                lt.fill_next_token_bitmask(matcher, lt.allocate_token_bitmask(1, self.vocab_size), 0)
        except (KeyboardInterrupt, SystemExit, EngineValidationError):
            raise
        except BaseException as exc:  # noqa: BLE001 - a Rust panic (a BaseException) ends this request alone
            logger.warning("grammar build raised %s", type(exc).__name__, exc_info=True)
            raise EngineValidationError(f"Invalid {spec.param}: its grammar could not be built "
                                        f"({type(exc).__name__})", spec.param) from None
        if matcher.is_error():
            raise grammar_error(matcher.get_error(), spec.param)
        return matcher

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class StructuredGate:
    """Requests waiting for their grammar before they enter `scheduler` (see the module's docstring)."""

    def __init__(self, tokenizer, vocab_size: int, scheduler, *, timeout_s: float = COMPILE_TIMEOUT_S,
                 cache_size: int = CACHE_SIZE, threads: int | None = None) -> None:
        self.scheduler = scheduler
        self.timeout_s = timeout_s
        self._args = (tokenizer, vocab_size, cache_size, threads or min(2, os.cpu_count() or 1))
        self._compiler: GrammarCompiler | None = None
        self.waiting: dict[str, tuple[Sequence, Future, float]] = {}

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:  # no pool, no llguidance, until a request asks for a grammar
            tokenizer, vocab_size, cache_size, threads = self._args
            self._compiler = GrammarCompiler(tokenizer, vocab_size, cache_size=cache_size, threads=threads)
        return self._compiler

    def submit(self, seq: Sequence) -> None:
        """Queue `seq` for its grammar; straight into the scheduler on a cache hit. Raises what a cached
        compile raised (EngineValidationError), ValueError on a duplicate request id."""
        rid = seq.request_id
        if rid in self.waiting or rid in self.scheduler.requests:
            raise ValueError(f"duplicate request id {rid!r}")
        future = self.compiler.submit(seq.sampling.structured_output)
        if future.done():
            seq.grammar = GrammarState(future.result().deep_copy())  # raises a cached failure
            self.scheduler.add(seq)
            return
        self.waiting[rid] = (seq, future, time.monotonic() + self.timeout_s)

    def poll(self) -> list[RequestOutput]:
        """Move the requests whose grammar is ready into the scheduler; end those whose compile failed or
        ran past its time bound. With nothing else to run, waits a little for a compile (no busy loop)."""
        if not self.waiting:
            return []
        if not self.scheduler.has_unfinished():
            concurrent.futures.wait([f for _, f, _ in self.waiting.values()], timeout=0.005,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        outputs = []
        now = time.monotonic()
        for rid, (seq, future, deadline) in list(self.waiting.items()):
            if not future.done():
                if now > deadline:
                    del self.waiting[rid]
                    outputs.append(self._fail(seq, EngineValidationError(
                        f"response_format's grammar did not compile within {self.timeout_s:g} s", PARAM)))
                continue
            del self.waiting[rid]
            try:
                seq.grammar = GrammarState(future.result().deep_copy())
            except Exception as exc:  # noqa: BLE001 - an invalid schema or a failed build ends this request
                outputs.append(self._fail(seq, exc))
                continue
            self.scheduler.add(seq)
        return outputs

    def abort(self, request_id: str) -> Sequence | None:
        entry = self.waiting.pop(request_id, None)
        if entry is None:
            return None
        return self._finish(entry[0], "abort")

    def _fail(self, seq: Sequence, error: BaseException) -> RequestOutput:
        if not isinstance(error, EngineValidationError):
            logger.error("request %s: grammar compile failed", seq.request_id, exc_info=error)
        out = request_output(self._finish(seq, "error"), [], "", None)
        out.error = error.message if isinstance(error, EngineValidationError) else f"{type(error).__name__}: {error}"
        return out

    @staticmethod
    def _finish(seq: Sequence, reason: str) -> Sequence:
        seq.status, seq.finish_reason, seq.finish_time = SeqStatus.FINISHED, reason, time.time()
        return seq
