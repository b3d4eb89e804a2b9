"""`python -m engine serve`: the engine behind an OpenAI-compatible HTTP API (vLLM's flags and metric names).

`app` (routes, `build_app`, `run`), `cli` (the flags), `protocol` (the wire format and its errors), `worker`
(the queue and the worker thread), `stream` and `text` (blocks to chunks, messages to ids), `metrics`
(Prometheus), `http_deadline` (uvicorn with a deadline for request headers).
"""
