"""The OpenAI-compatible HTTP server.

  server.py              run it: uvicorn, the Engine built in the background, warmup, drain on SIGTERM
  app.py                 the FastAPI app: error handlers, the guard (API key, 500s), the routes
  routes_completions.py  POST /v1/chat/completions, /v1/completions
  routes_info.py         /health, /metrics, /v1/models, /tokenize, /detokenize, /tokenizer_info
  state.py               GatewayState: what the routes share
  parsing.py             body size, JSON, schema and model checks of every POST route
  protocol.py            the request schemas (pydantic)
  convert.py, tools.py   request -> PreparedPrompt, SamplingParams, OutputOptions, max_tokens
  runs.py                the engine requests of one HTTP request: submit, follow, wait, close, log
  streams.py, responses.py, echo.py   the response bodies: SSE chunks, JSON objects, echo log-probs
  errors.py              errors in the OpenAI envelope; metrics.py: the Prometheus exposition
"""
