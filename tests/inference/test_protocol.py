"""The worker↔web protocol: its wire form round-trips, and its type strings live in one module."""

from __future__ import annotations

import re
from pathlib import Path

import msgpack

from inference import protocol
from inference.protocol import BATCH, DELTA, DONE, Batch, Delta, Done, Timing, Usage

ROOT = Path(__file__).resolve().parents[2]
# Not product code: the tests, docs, deploy files, hidden folders (virtual environments); nor is the protocol module.
NOT_PRODUCT = {"tests", "docs", "deploy", "node_modules"}


def test_a_batch_survives_the_channel_layers_msgpack_unchanged():
    events = [
        Delta("r1", "Hé", [1, 2], [{"token": "H", "logprob": -0.5, "bytes": [72], "top_logprobs": []}]),
        Delta("r2", "", [3]),
        Done("r1", "length", Usage(prompt_tokens=5, cached_tokens=4, completion_tokens=2),
             Timing(queued_s=0.01, ttft_s=0.02, e2e_s=0.5, engine_ttft_s=0.015)),
        Done("r2", "error", Usage(prompt_tokens=5), error="This model's maximum context length is 8 tokens.",
             error_param="prompt"),
    ]
    wire = msgpack.unpackb(msgpack.packb(Batch(events).encode()), raw=False)  # what channels_redis does
    assert wire["type"] == BATCH and [event["type"] for event in wire["events"]] == [DELTA, DELTA, DONE, DONE]
    assert Batch.decode(wire).events == events


def test_the_parameter_at_fault_travels_once_and_only_when_there_is_one():
    assert "error_param" not in Done("r", "stop").encode() and Done("r", "stop").encode()["error"] is None
    failed = Done("r", "error", error="Invalid 'top_p'.", error_param="top_p").encode()
    assert failed["error"] == "Invalid 'top_p'." and failed["error_param"] == "top_p"


def test_unknown_messages_and_events_are_dropped():
    assert Batch.decode({"type": "something.else"}).events == []
    message = Batch([Delta("r", "a", [1])]).encode()
    message["events"] += [{"type": "engine.newer", "request_id": "r"}, "junk"]
    assert Batch.decode(message).events == [Delta("r", "a", [1])]


def _type_strings() -> set[str]:
    strings = {value for name, value in vars(protocol).items() if name.isupper() and isinstance(value, str)
               and value.startswith("engine.")}
    assert strings >= {DELTA, DONE, BATCH}
    return strings


def test_no_event_type_string_appears_outside_the_protocol_module():
    """Both sides name the events through inference.protocol; a type string written anywhere else in
    the product code (a third event shape, a hand-made dict) fails here."""
    pattern = re.compile("|".join(re.escape(s) for s in sorted(_type_strings(), key=len, reverse=True))
                         + r"|engine\.events")  # the batch type of the old wire format
    offenders = []
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in NOT_PRODUCT or relative.parts[0].startswith(".") or path == Path(protocol.__file__):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "event type strings outside inference/protocol.py:\n" + "\n".join(offenders)
