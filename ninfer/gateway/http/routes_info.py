"""The routes around generation: /health, /metrics, /v1/models, and the tokenizer routes
(/tokenize, /detokenize, /tokenizer_info)."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from ninfer.gateway.http.convert import frontend_call, frontend_messages
from ninfer.gateway.http.errors import bad_request
from ninfer.gateway.http.media_parts import acquire_async, call_with_media
from ninfer.gateway.http.metrics import CONTENT_TYPE, render
from ninfer.gateway.http.parsing import check_model, parse
from ninfer.gateway.http.protocol import DetokenizeRequest, TokenizeRequest
from ninfer.gateway.http.state import GatewayState


def add_info_routes(app: FastAPI, state: GatewayState, registry: CollectorRegistry) -> None:
    # ---- health, metrics, models ----------------------------------------------------------
    @app.get("/health")
    async def health():
        """200 {"status": "ready"}; else 503 {"status", "reason"}, and while the model loads or the warmup
        runs "progress" (`Engine.progress`: phase, done, total, unit, fraction, elapsed_s, eta_s), with
        status "loading" while the weights are read."""
        st, ready, reason = state.availability()
        if ready:
            return JSONResponse({"status": "ready"})
        body = {"status": st, "reason": reason}
        progress = getattr(state.engine, "progress", None)
        p = progress() if callable(progress) and st == "starting" else None
        if p is not None:
            body["progress"] = p
            if p["phase"] == "loading":
                body["status"] = "loading"
        return JSONResponse(body, status_code=503)

    @app.get("/metrics")
    async def metrics():
        return Response(render(registry), media_type=CONTENT_TYPE)

    def model_card() -> dict:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "ninfer"}
        if state.synthetic:
            card["synthetic_weights"] = True
        if state.demo:
            card["demo"] = True
        if state.limits is not None:
            card["max_model_len"] = state.limits.max_model_len
        return card

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        check_model(state, model_id)
        return model_card()

    # ---- tokenizer ------------------------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(request: Request):
        engine, req = await parse(state, request, TokenizeRequest)
        fe = engine.frontend
        if req.prompt is not None:
            prompt = frontend_call(fe.prepare_text, req.prompt, param="prompt", what="cannot tokenize")
        else:
            tools = [t.model_dump(exclude_none=True) for t in req.tools or ()] or None
            media = await acquire_async(req.messages, state.media)
            prompt = await call_with_media(media, frontend_call, fe.prepare_chat,
                                           frontend_messages(req.messages, media=media), tools=tools,
                                           chat_template_kwargs=req.chat_template_kwargs,
                                           add_generation_prompt=req.add_generation_prompt,
                                           param="messages", what="cannot tokenize")
        ids = list(prompt.token_ids)
        body = {"count": len(ids), "max_model_len": state.limits.max_model_len, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = [state.pieces.text(t) for t in ids]
        return body

    @app.post("/detokenize")
    async def detokenize(request: Request):
        engine, req = await parse(state, request, DetokenizeRequest)
        vocab = state.limits.vocab_size
        for j, t in enumerate(req.tokens):
            if not (0 <= t < vocab):
                raise bad_request(f"token id {t} is outside the vocabulary (0..{vocab - 1})",
                                  param=f"tokens[{j}]")
        return {"prompt": engine.frontend.tokenizer.decode(list(req.tokens))}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        engine = state.ready_engine()
        fe = engine.frontend
        info = {"model": state.model_name, "tokenizer_class": "Qwen2Tokenizer",
                "vocab_size": state.limits.vocab_size, "max_model_len": state.limits.max_model_len,
                "eos_token_ids": list(fe.eos_token_ids)}
        if fe.chat_template is not None:
            info["chat_template"] = fe.chat_template.source
        return info
