"""A bounded closed-loop load on the OpenAI-compatible API, for Locust (headless, loopback only).

    LOAD_KEYS='{"pro": "sk-...", "free": "sk-..."}' LOAD_LOG=load.jsonl \\
        python -m locust -f benchmarks/locustfile.py --headless -u 12 -r 12 -t 60s --host http://127.0.0.1:8000

Each user picks a tier (free, pro, enterprise: 4, 6 and 2 of every 12
users, those with a key in LOAD_KEYS) and loops without pause: 80% streamed
chat completions (the time to the first content chunk is the client's TTFT),
10% streams the client closes after two chunks (the server must abort and
bill them), 10% whole responses. Prompts share a system prefix (prefix-cache
hits) and differ after it. A 429 or 503 is the platform's policy (rate limit,
quota, no capacity): the user waits its Retry-After (at most 2 s) and goes
on; it counts as a success for Locust. Anything else (another status, a
stream without `[DONE]`, an error event) is a failure.

With more users than the worker's batch (`run_worker --max-num-seqs`), the
engine never idles and a queue always waits: the load runs at the
saturation rate, whatever the machine's speed.

Every request is also one line of LOAD_LOG (JSON): start time, tier, kind,
status, ttft_s, e2e_s, error. benchmarks/soak.py and tests/e2e read it.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid

from locust import HttpUser, task

MODEL = os.environ.get("LOAD_MODEL", "smollm2-135m-instruct")
KEYS: dict[str, str] = json.loads(os.environ.get("LOAD_KEYS", "{}"))
LOG_PATH = os.environ.get("LOAD_LOG", "")
TIERS = [tier for tier in ["free"] * 4 + ["pro"] * 6 + ["enterprise"] * 2 if tier in KEYS] or sorted(KEYS)
SYSTEM = "You are a terse assistant. Answer in one short sentence. " * 4
TOPICS = ["the sea", "a mountain", "bread", "rain", "a bicycle", "the moon", "a library", "coffee", "a river", "snow"]
POLICY = {429, 503}

_log = open(LOG_PATH, "a", buffering=1) if LOG_PATH else None  # one line per request, flushed at each line
_next_tier = iter(range(10**9))


def log(**entry) -> None:
    if _log is not None:
        _log.write(json.dumps(entry) + "\n")


class ChatUser(HttpUser):
    def on_start(self) -> None:
        self.tier = TIERS[next(_next_tier) % len(TIERS)]
        self.headers = {"Authorization": f"Bearer {KEYS[self.tier]}"}

    def _body(self, stream: bool) -> dict:
        body = {"model": MODEL, "max_tokens": random.randint(16, 48), "temperature": 0.7, "stream": stream,
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": f"Tell me about {random.choice(TOPICS)} ({uuid.uuid4().hex[:6]})."}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _policy_wait(self, response) -> None:
        try:
            wait = float(response.headers.get("Retry-After", "1"))
        except ValueError:
            wait = 1.0
        time.sleep(min(2.0, max(0.1, wait)))

    @task(8)
    def stream(self) -> None:
        self._stream(cancel_after=None)

    @task(1)
    def stream_cancelled(self) -> None:
        self._stream(cancel_after=2)

    @task(1)
    def whole(self) -> None:
        started = time.time()
        with self.client.post("/v1/chat/completions", json=self._body(False), headers=self.headers,
                              name="chat (whole)", catch_response=True) as response:
            error = None
            if response.status_code == 200:
                if not response.json().get("usage", {}).get("completion_tokens"):
                    error = "no tokens"
            elif response.status_code not in POLICY:
                error = f"status {response.status_code}: {response.text[:200]}"
            self._end(response, error)
            log(t=started, tier=self.tier, kind="whole", status=response.status_code, ttft_s=None,
                e2e_s=time.time() - started, error=error)
        if response.status_code in POLICY:
            self._policy_wait(response)

    def _stream(self, *, cancel_after: int | None) -> None:
        started = time.time()
        kind = "stream" if cancel_after is None else "cancelled"
        ttft = None
        error = None
        with self.client.post("/v1/chat/completions", json=self._body(True), headers=self.headers, stream=True,
                              name=f"chat ({kind})", catch_response=True) as response:
            if response.status_code == 200:
                chunks, done = 0, False
                for line in response.iter_lines():
                    if not line or not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        error = f"error event: {event['error']}"
                        break
                    if ttft is None and event.get("choices") and event["choices"][0]["delta"].get("content"):
                        ttft = time.time() - started
                    chunks += 1
                    if cancel_after is not None and chunks >= cancel_after:
                        break
                if cancel_after is None and not done and error is None:
                    error = "stream ended without [DONE]"
            elif response.status_code not in POLICY:
                error = f"status {response.status_code}: {response.text[:200]}"
            self._end(response, error)
            log(t=started, tier=self.tier, kind=kind, status=response.status_code, ttft_s=ttft,
                e2e_s=time.time() - started, error=error)
            response.close()  # a cancelled stream: the server sees the client leave
        if response.status_code in POLICY:
            self._policy_wait(response)

    @staticmethod
    def _end(response, error: str | None) -> None:
        if error is None:
            response.success()
        else:
            response.failure(error)
