"""A null gateway: streams chat chunks on a fixed step clock at almost no cost, for serving.py's loaded floor.

    python benchmarks/null_gateway.py --step-ms 145 [--burn]      # prints "port N" when listening

It answers `POST /v1/chat/completions` (stream=True) the way the real API does
on the wire (HTTP/1.1 keep-alive, chunked SSE: a role chunk at once, one content
chunk per step, a finish chunk carrying `timing`, a usage chunk, `[DONE]`), with
none of the real gateway's work: no key check, no tokenising, no queue, no
channel layer, chunks pre-encoded. Steps tick every --step-ms like an engine's
decode steps; a request that arrives between two ticks gets its first content
chunk at the next one (the engine likewise admits new requests at a step
boundary), first tokens written before the running streams' next tokens (as the
worker orders a step's events). `timing.ttft_s` is measured like the worker's:
from the request being read to its first token being handed over for writing.

With --burn a second process keeps one core busy with float32 matmuls on one
torch thread, as the engine keeps a core busy during the API phase; the client
then shares the other core with this server, as it shares it with the web
process and Redis there. serving.py's paired overhead against this server is
what the SDK client, loopback HTTP and this machine's scheduling cost when the
gateway costs next to nothing: the floor under any gateway's paired overhead
under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

MODEL = "smollm2-135m-instruct"
BURN = ("import os, torch; torch.set_num_threads(1); a = torch.randn(512, 512); b = torch.randn(512, 512)\n"
        "parent = os.getppid()\n"
        "while os.getppid() == parent: a = (a @ b).clamp_(-1, 1)")  # ends with its parent, however that ends


def chunked(data: bytes) -> bytes:
    """`data` as one chunk of an HTTP/1.1 chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict) -> bytes:
    return chunked(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The body of the next request on an HTTP/1.1 keep-alive connection (IncompleteReadError at its end)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return await reader.readexactly(length)


def _chunk(delta: dict, finish_reason: str | None = None, **extra) -> dict:
    return {"id": "chatcmpl-null", "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL,
            "system_fingerprint": "fp_null", "service_tier": "default",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            "usage": None, **extra}


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
ROLE = _event(_chunk({"role": "assistant", "content": "", "refusal": None}))
TOKEN = _event(_chunk({"content": " word"}))
DONE = chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"


@dataclass(slots=True)
class Stream:
    writer: asyncio.StreamWriter
    remaining: int
    total: int
    read_at: float  # the request was read: the worker's enqueue, here
    ttft_s: float | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class NullGateway:
    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.new: list[Stream] = []
        self.running: list[Stream] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = json.loads(await read_request(reader))
                tokens = max(1, int(body.get("max_tokens") or 16))
                stream = Stream(writer, tokens, tokens, time.perf_counter())
                writer.write(HEAD + ROLE)
                self.new.append(stream)
                await stream.ended.wait()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.CancelledError):
            writer.close()  # the client left, sent something else, or the server is stopping

    def _token(self, stream: Stream, now: float) -> bool:
        """Write one content chunk (and the stream's end after its last); True while it runs on."""
        if stream.ttft_s is None:
            stream.ttft_s = now - stream.read_at
        stream.remaining -= 1
        if stream.remaining > 0:
            stream.writer.write(TOKEN)
            return True
        timing = {"queued_s": 0.0, "ttft_s": stream.ttft_s, "e2e_s": now - stream.read_at,
                  "engine_queued_s": 0.0, "engine_ttft_s": stream.ttft_s, "engine_e2e_s": now - stream.read_at}
        usage = {"prompt_tokens": 0, "completion_tokens": stream.total, "total_tokens": stream.total}
        stream.writer.write(TOKEN + _event(_chunk({}, "length", timing=timing))
                            + _event({**_chunk({}), "choices": [], "usage": usage}) + DONE)
        stream.ended.set()
        return False

    async def steps(self) -> None:
        tick = time.perf_counter()
        while True:
            tick += self.step_s
            await asyncio.sleep(max(0.0, tick - time.perf_counter()))
            now = time.perf_counter()
            first, self.new = self.new, []
            # a step's first tokens go out before the running streams' next tokens, as the worker orders them
            self.running = [s for s in first + self.running if self._token(s, now)]


async def serve(step_s: float) -> None:
    """Serve until SIGTERM or SIGINT."""
    gateway = NullGateway(step_s)
    server = await asyncio.start_server(gateway.handle, "127.0.0.1", 0)
    steps = asyncio.ensure_future(gateway.steps())
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, steps.cancel)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)  # ready, and a SIGTERM now ends it cleanly
    try:
        await steps
    except asyncio.CancelledError:
        pass
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=145.0, help="time between steps (the engine's ITL)")
    parser.add_argument("--burn", action="store_true", help="keep one core busy in a second process (the engine)")
    args = parser.parse_args()
    burner = subprocess.Popen([sys.executable, "-c", BURN]) if args.burn else None
    try:
        try:
            import uvloop  # what uvicorn runs on
        except ImportError:
            asyncio.run(serve(args.step_ms / 1000))
        else:
            uvloop.run(serve(args.step_ms / 1000))
    finally:
        if burner is not None:
            burner.kill()


if __name__ == "__main__":
    main()
