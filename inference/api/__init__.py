"""OpenAI-compatible serving API: request validation, job building, response shapes.

- `parsing`: raw body bytes -> JSON object (never a 500 for junk).
- `schemas`: JSON object -> validated `ApiRequest` (400 with `param` on any bad field).
- `model_access`: which models exist, which a tier may use, their context length.
- `services`: tokenise, apply tier limits, build and submit the queue `Job`.
- `events`: read a job's engine events from its reply channel.
- `responses`: `chat.completion`, `chat.completion.chunk` and `text_completion` objects.
- `views`: the async REST + SSE endpoints; `inference.consumers` serves the WebSocket.
"""
