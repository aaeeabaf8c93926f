"""What the worker loop needs of an engine: inference.engine.Engine, or a test's stand-in.

A structural type (typing.Protocol), so the loop states what it calls without
importing the engine (and torch) where only the type is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from inference.engine.config import EngineConfig
    from inference.engine.outputs import RequestOutput
    from inference.engine.sampling_params import SamplingParams


class ServingEngine(Protocol):
    config: EngineConfig  # the loop reads max_num_seqs from it
    dead: str | None  # why the engine stopped for good (a broken device), else None
    # what decides its tokens, hashed (inference.engine.fingerprint); sent with each request's events.
    # A stand-in without one (getattr default None) leaves the API's model-name fingerprint.
    system_fingerprint: str | None

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                    priority: int = 0, cache_salt: str | None = None) -> None:
        """Queue a request; raises EngineValidationError (PromptTooLongError) when it is invalid."""

    def abort(self, request_id: str) -> bool:
        """Free the request now; the next step() reports it finished ("abort")."""

    def step(self, *, on_first_tokens: Callable[[list[str]], None] | None = None) -> list[RequestOutput]:
        """One iteration: this step's news for each request it touched."""

    def has_unfinished(self) -> bool: ...

    def stats(self) -> dict[str, Any]:
        """running, waiting, kv_usage and other figures for the heartbeat."""
