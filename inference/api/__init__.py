"""OpenAI-compatible serving API: request validation, job building, response shapes.

- `parsing`: raw body bytes -> JSON object (never a 500 for junk).
- `schemas`: JSON object -> validated `ApiRequest` (400 with `param` on any bad field).
- `model_access`: which models exist, which a tier may use, their context length.
- `services`: tokenise, apply tier limits, build and submit the queue `Job`.
- `replies`: the process's shared reply channel, demultiplexing events by request id.
- `job_run`: read one job's events (`JobRun`, inference.protocol), cancel it when the reader leaves,
  and turn them into the response chunks every path renders (`job_chunks`).
- `responses`: `chat.completion`, `chat.completion.chunk` and `text_completion` objects.
- `completion_views`: the async REST + SSE completion endpoints; `inference.consumers` serves the
  WebSocket, `inference.views` the small ones (health, metrics, models, OpenAPI).
"""
