"""The requests of the batch-invariance tests (tests/engine/test_batch_invariant.py and
tests/e2e/test_batch_invariant_api.py): 12 seeded targets sharing a system prompt, half greedy and
half at temperature 0.8 (some with top_p, top_k and top logprobs), and 32 other requests of mixed lengths to
run beside them (some with a wider top_k and more logprobs)."""

from __future__ import annotations

import random

SYSTEM = ("You are a careful assistant for a small bakery. Answer in one short sentence, "
          "mention the bakery's name, Crumb & Co., and never use lists.")
QUESTIONS = [
    "When do you open?", "Do you sell rye bread?", "Can I order a birthday cake?", "Is there parking?",
    "What is your best pastry?", "Do you have vegan options?", "How much is a baguette?",
    "Can I pay by card?", "Do you deliver?", "What flour do you use?", "Are you open on Sunday?",
    "Do you bake gluten-free bread?",
]
MAX_TOKENS = 8


def target_sampling(i: int) -> dict:
    """SamplingParams fields of target i: even ones greedy, odd ones at 0.8 (every other of those with top_p
    0.9, or top_k 20 and top_p 0.95, and 5 top logprobs); every one seeded."""
    fields = {"temperature": 0.0 if i % 2 == 0 else 0.8, "seed": 1000 + i, "max_tokens": MAX_TOKENS,
              "ignore_eos": True}
    if i % 4 == 1:
        fields.update(top_p=0.9, logprobs=5)
    elif i % 4 == 3:
        fields.update(top_k=20, top_p=0.95, logprobs=5)
    return fields


def other_requests(vocab_size: int, count: int = 32, seed: int = 7) -> list[tuple[list[int], dict]]:
    """(prompt ids, sampling fields) of `count` requests with 3-60 random prompt tokens and 2-12 outputs."""
    rng = random.Random(seed)
    requests = []
    for j in range(count):
        sampling = {"temperature": rng.choice((0.0, 0.7, 1.0)), "max_tokens": rng.randint(2, 12), "ignore_eos": True}
        if j % 4 == 1:  # wider candidates than the targets': batched, the step's widest would decide their ties
            sampling.update(temperature=1.0, top_k=1000, logprobs=20)
        requests.append(([rng.randrange(100, vocab_size) for _ in range(rng.randint(3, 60))], sampling))
    return requests
