"""The prompts of benchmarks/engine_offline.py's `--workload` (issue 40: speculative decoding is measured on them).

  random      random token ids (200..vocab, no special ids): the benchmark's prompts before --workload existed;
              `random_prompts` draws them exactly as it always has.
  extractive  each request asks the model to rewrite, quote or summarize a passage of about PASSAGE_TOKENS
              tokens: a piece of a Python source file of this repository or of its Markdown prose (README.md,
              docs/architecture.md). The answer copies much of the prompt, so n-gram prompt-lookup speculation
              pays. The passages are cut from the files on line boundaries with the model's tokenizer.
  chat        short open-ended user questions (CHAT_QUESTIONS), each round of them under another system prompt.

extractive and chat prompts are one user message rendered with the model's chat template (generation prompt
added) and encoded by its tokenizer. They are deterministic for a checkout, a tokenizer and a seed: the seed
picks the order of passages / questions and the instruction rotation, and request `i` takes the i-th of them,
so consecutive requests differ. The benchmark still runs these requests with `ignore_eos` and `--output-len`
tokens each, greedy, as with random prompts: token counts stay comparable between workloads, and the output is
what the model would write (until it would have stopped) rather than a fixed length of copy.
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("random", "extractive", "chat")
PASSAGE_TOKENS = 500
CODE_SOURCES = ("inference/engine/scheduler.py", "inference/engine/sampler.py", "inference/engine/chat_template.py")
PROSE_SOURCES = ("README.md", "docs/architecture.md")

CODE_INSTRUCTIONS = (
    "Rewrite the following code with the same behaviour, keeping names:\n\n```python\n{passage}\n```",
    "Add a one-line comment above each function of the following code and repeat the code in full:"
    "\n\n```python\n{passage}\n```",
    "Quote, word for word, every line of the following code that contains `self.`:\n\n```python\n{passage}\n```",
    "Summarize what the following code does, quoting the names it defines:\n\n```python\n{passage}\n```",
)
PROSE_INSTRUCTIONS = (
    "Summarize the following text in a few sentences, quoting its key phrases:\n\n{passage}",
    "Quote the longest paragraph of the following text word for word, then say in one sentence what it is "
    "about:\n\n{passage}",
    "Rewrite the following text in plain English, keeping its structure, its names and every number:\n\n{passage}",
    "Correct any typos in the following text and repeat it in full:\n\n{passage}",
)

CHAT_QUESTIONS = (
    "What is the difference between a list and a tuple in Python?",
    "Give me three ideas for a rainy Sunday afternoon.",
    "Why is the sky blue?",
    "How do I make a simple tomato sauce?",
    "Explain recursion to a ten-year-old.",
    "What are the main causes of inflation?",
    "Write a short poem about autumn leaves.",
    "How does a hash table work?",
    "What should I pack for a weekend hiking trip?",
    "Can you explain what a neural network is in simple terms?",
    "What are some tips for getting better sleep?",
    "Why do cats purr?",
    "How do I politely decline a meeting invitation?",
    "What is the capital of Australia, and why is it not Sydney?",
    "Suggest a name for a small coffee shop near a university.",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "Give me a beginner's plan to start running.",
    "How do I center a div in CSS?",
    "Tell me a fun fact about octopuses.",
)
CHAT_SYSTEMS = (None, "You are a concise assistant. Answer briefly.",
                "You are a friendly tutor who explains things step by step.",
                "You are an expert who answers precisely and mentions caveats.")


def random_prompts(rng: random.Random, n: int, lo: int, hi: int, vocab: int, banned: set[int]) -> list[list[int]]:
    """`n` prompts of lo..hi random token ids in 200..vocab, none in `banned` (the random workload)."""
    ids = [i for i in range(200, vocab) if i not in banned]
    return [[rng.choice(ids) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def cut_passages(text: str, tokenizer, target: int = PASSAGE_TOKENS) -> list[str]:
    """`text` cut on line boundaries into consecutive passages of target ±10% tokens, each as close to target as
    its lines allow (a line too long to fit is cut to fill the passage); a remainder shorter than that is dropped."""
    lo, hi = int(target * 0.9), int(target * 1.1)
    out, cur, n = [], [], 0
    for line in text.splitlines(keepends=True):
        ids = tokenizer.encode(line)
        if n >= lo and n + len(ids) - target > target - n:  # the line would take it further from target
            out.append("".join(cur))
            cur, n = [], 0
        if n + len(ids) > hi:
            cur.append(tokenizer.decode(ids[: target - n], skip_special_tokens=False))
            out.append("".join(cur))
            cur, n = [], 0
            continue
        cur.append(line)
        n += len(ids)
    return [p.strip("\n") for p in out if p.strip()]


@lru_cache(maxsize=4)
def _passage_pool(tokenizer, target: int) -> tuple[tuple[str, str], ...]:
    """(kind, passage) for every passage of the source files, kind "code" or "prose", in a fixed order."""
    pool = []
    for kind, sources in (("code", CODE_SOURCES), ("prose", PROSE_SOURCES)):
        for source in sources:
            text = (ROOT / source).read_text(encoding="utf-8")
            pool.extend((kind, p) for p in cut_passages(text, tokenizer, target))
    if not pool:
        raise RuntimeError("no passage could be cut from the workload's source files")
    return tuple(pool)


def extractive_messages(tokenizer, n: int, seed: int, start: int = 0,
                        target: int = PASSAGE_TOKENS) -> list[tuple[str, list[dict]]]:
    """(passage, chat messages) of requests start..start+n-1: request i takes passage order[i % P] of the
    seed-shuffled pool and, for its kind, instruction (i % P + i // P + seed) % K, so a passage comes back
    with another instruction in each round through the pool."""
    pool = _passage_pool(tokenizer, target)
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    out = []
    for i in range(start, start + n):
        a, b = i % len(pool), i // len(pool)
        kind, passage = pool[order[a]]
        instructions = CODE_INSTRUCTIONS if kind == "code" else PROSE_INSTRUCTIONS
        text = instructions[(a + b + seed) % len(instructions)].format(passage=passage)
        out.append((passage, [{"role": "user", "content": text}]))
    return out


def chat_messages(n: int, seed: int, start: int = 0) -> list[list[dict]]:
    """Chat messages of requests start..start+n-1: question order[i % Q] of the seed-shuffled questions, under
    system prompt (i // Q) % S (None: the template's default), so the first Q * S requests are all different."""
    order = list(range(len(CHAT_QUESTIONS)))
    random.Random(seed).shuffle(order)
    out = []
    for i in range(start, start + n):
        system = CHAT_SYSTEMS[(i // len(order)) % len(CHAT_SYSTEMS)]
        user = {"role": "user", "content": CHAT_QUESTIONS[order[i % len(order)]]}
        out.append(([{"role": "system", "content": system}] if system else []) + [user])
    return out


def phase_prompts(args, tokenizer, rng: random.Random, vocab: int, banned: set[int]) -> dict:
    """engine_offline.py's prompts of its prefill, single-stream and main phases: random ones drawn from `rng`
    in that order (as before --workload), or requests 0.., P (single), P+1.. of a workload (P: prefill's)."""
    if args.workload == "random":
        return {"prefill": random_prompts(rng, args.prefill_requests, args.prompt_max, args.prompt_max, vocab,
                                          banned),
                "single": random_prompts(rng, 1, args.single_prompt_len, args.single_prompt_len, vocab, banned),
                "main": random_prompts(rng, args.requests, args.prompt_min, args.prompt_max, vocab, banned)}
    n = args.prefill_requests
    return {"prefill": workload_prompts(args.workload, tokenizer, n, args.seed),
            "single": workload_prompts(args.workload, tokenizer, 1, args.seed, start=n),
            "main": workload_prompts(args.workload, tokenizer, args.requests, args.seed, start=n + 1)}


def cycled(prompts: list[list[int]], n: int) -> list[list[int]]:
    return [prompts[i % len(prompts)] for i in range(n)]


def describe(prompts: list[list[int]]) -> str:
    lens = sorted(map(len, prompts))
    return f"{len(prompts)} x {lens[0]}" if lens[0] == lens[-1] else f"{len(prompts)} x {lens[0]}..{lens[-1]}"


def hf_batch(args, rng: random.Random, batch: int, vocab: int, fixed: dict | None) -> tuple[list, list]:
    """(ids, attention mask) of one HF peer batch: random prompts of --single-prompt-len (as before
    --workload), or the engine's prompts (`fixed`: its single-stream one for batch 1, its main ones cycled for
    larger batches) left-padded with token 0."""
    if fixed is None:
        ids = random_prompts(rng, batch, args.single_prompt_len, args.single_prompt_len, vocab, set())
        return ids, [[1] * len(p) for p in ids]
    prompts = [fixed["single"]] if batch == 1 else cycled(fixed["batch"], batch)
    width = max(map(len, prompts))
    return ([[0] * (width - len(p)) + p for p in prompts],
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts])


def workload_prompts(name: str, tokenizer, n: int, seed: int, start: int = 0) -> list[list[int]]:
    """Token ids of requests start..start+n-1 of workload `name` ("extractive" or "chat"), rendered with the
    tokenizer's chat template. The random workload draws from an rng instead: `random_prompts`."""
    if name == "extractive":
        messages = [m for _, m in extractive_messages(tokenizer, n, seed, start)]
    elif name == "chat":
        messages = chat_messages(n, seed, start)
    else:
        raise ValueError(f"workload {name!r} has no fixed prompts (one of {WORKLOADS[1:]})")
    return [tokenizer.encode_chat(m, add_generation_prompt=True) for m in messages]
