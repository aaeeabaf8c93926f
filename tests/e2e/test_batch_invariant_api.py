"""Batch invariance through the API, on a real server: an embedded uvicorn process whose served model
has batch_invariant on (the operator's switch, ServedModel.batch_invariant). 12 seeded chat requests
of one tenant, greedy and at temperature 0.8, give the same tokens (and log-probabilities) alone and
beside 16 concurrent streams of another tenant, streamed or not; every response object carries the
worker's system_fingerprint."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.e2e.processes import MODEL, EmbeddedServer, manage
from tests.engine.invariance_cases import QUESTIONS, SYSTEM, target_sampling

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SWITCH_ON = ("from inference.models import ServedModel; "
             f"assert ServedModel.objects.filter(name={MODEL!r}).update(batch_invariant=True) == 1")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = EmbeddedServer(tmp_path_factory.mktemp("invariant_api"))
    try:
        manage(server.env, "shell", "-c", SWITCH_ON)  # before the first request loads the engine
        yield server
    finally:
        server.stop()


def client(server, tier: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.keys[tier], max_retries=0, timeout=600)


async def target(api: openai.AsyncOpenAI, i: int, *, stream: bool) -> tuple[list[tuple], set[str]]:
    """Target i -> ([(token, logprob)], the system fingerprints of its response objects)."""
    sampling = target_sampling(i)
    kwargs = dict(model=MODEL, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[i]}],
                  max_tokens=sampling["max_tokens"], temperature=sampling["temperature"], seed=sampling["seed"],
                  logprobs=True)
    if not stream:
        completion = await api.chat.completions.create(**kwargs)
        tokens = [(entry.token, entry.logprob) for entry in completion.choices[0].logprobs.content]
        return tokens, {completion.system_fingerprint}
    tokens, fingerprints = [], set()
    async for chunk in await api.chat.completions.create(stream=True, **kwargs):
        fingerprints.add(chunk.system_fingerprint)
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                tokens.extend((entry.token, entry.logprob) for entry in choice.logprobs.content)
    return tokens, fingerprints


async def other_stream(api: openai.AsyncOpenAI, j: int) -> int:
    words = " ".join(["tell me a long story about the sea and its ships"] * (1 + j % 5))
    count = 0
    async for chunk in await api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"{j}: {words}"}], max_tokens=12 + j % 12,
            temperature=0.9, stream=True):
        count += sum(1 for choice in chunk.choices if choice.delta.content)
    return count


def test_same_tokens_alone_and_beside_another_tenants_streams(server):
    async def scenario():
        mine, theirs = client(server, "pro"), client(server, "enterprise")
        alone = [await target(mine, i, stream=True) for i in range(len(QUESTIONS))]
        loaded = [asyncio.create_task(other_stream(theirs, j)) for j in range(16)]
        await asyncio.sleep(0.5)  # their streams are in the engine first
        beside = await asyncio.gather(*(target(mine, i, stream=i % 3 != 0) for i in range(len(QUESTIONS))))
        return alone, beside, await asyncio.gather(*loaded)

    alone, beside, others = asyncio.run(scenario())
    assert all(count > 0 for count in others)
    fingerprints = set().union(*(f for _, f in alone), *(f for _, f in beside))
    assert len(fingerprints) == 1, fingerprints  # every chunk and body of every response: the worker's
    fingerprint = fingerprints.pop()
    from inference.api.responses import system_fingerprint

    assert fingerprint.startswith("fp_") and fingerprint != system_fingerprint(MODEL)  # not the fallback
    for i, ((tokens_alone, _), (tokens_beside, _)) in enumerate(zip(alone, beside)):
        assert 0 < len(tokens_alone) <= target_sampling(i)["max_tokens"]
        assert tokens_beside == tokens_alone, f"target {i}"
