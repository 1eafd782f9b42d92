"""The OpenAI-compatible HTTP server: protocol models, request conversion, SSE responses,
errors in the OpenAI envelope, Prometheus metrics."""
