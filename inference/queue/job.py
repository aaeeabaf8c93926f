"""The unit of work on a queue: one generation request, JSON on the wire."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

ENDPOINTS = ("chat.completions", "completions")


@dataclass(slots=True)
class Job:
    # Field order follows CONTRACTS section 4, so positional construction works too.
    request_id: str
    tenant_id: int
    api_key_id: int | None
    tier: str
    priority: int  # engine priority: lower runs first (Tier.priority)
    model: str
    prompt_token_ids: list[int]
    sampling: dict[str, Any]  # SamplingParams fields
    reply_channel: str
    enqueued_at: float = field(default_factory=time.time)  # unix seconds, set by the web process
    reservation_id: str | None = None
    cache_salt: str | None = None
    endpoint: str = "chat.completions"
    tenant_slug: str = ""
    batch_id: str = ""  # a Batch API line's batch (its public id): billed at the batch price (billing.settlement)
    prefix_keys: list[str] = field(default_factory=list)  # routing keys of the prompt's first blocks (queue.routing)

    def __post_init__(self) -> None:
        # Queue keys are built from these; a tab would break the location
        # strings the Redis scripts keep (see redis_scripts.py).
        for name in ("request_id", "tier", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "\t" in value:
                raise ValueError(f"Job.{name} must be a non-empty string without tabs")
        # The Redis backend keeps them comma-joined; routing.prefix_keys makes 16 hex digits each.
        if not all(isinstance(key, str) and key.isalnum() and len(key) <= 64 for key in self.prefix_keys):
            raise ValueError("Job.prefix_keys must be short alphanumeric strings")

    @property
    def tenant_key(self) -> str:
        """The tenant's sub-queue name inside its tier."""
        return str(self.tenant_id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Job":
        # Unknown keys are ignored so that a newer web process can add fields
        # without breaking workers that are still running the older code.
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    @classmethod
    def from_json(cls, text: str | bytes) -> "Job":
        return cls.from_dict(json.loads(text))
