"""The model's generation_config sampling fields become the defaults for fields a request omits."""
from __future__ import annotations

import json

from ninfer.gateway.http.convert import ModelLimits, sampling_params
from ninfer.gateway.http.protocol import ChatCompletionRequest
from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
from ninfer.targets.qwen3_6.frontend import vocab


def _frontend(gen: dict) -> Qwen36Frontend:
    return Qwen36Frontend.from_resources({
        "tokenizer.json": vocab.tokenizer_json_bytes(),
        "tokenizer_config.json": json.dumps(vocab.tokenizer_config()).encode(),
        "chat_template.jinja": vocab.chat_template().encode(),
        "generation_config.json": json.dumps(gen).encode(),
    })


def test_generation_config_defaults_are_read():
    fe = _frontend({"eos_token_id": [248046, 248044], "do_sample": True, "temperature": 0.6,
                    "top_k": 20, "top_p": 0.95, "pad_token_id": 248044})
    assert fe.sampling_defaults == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert _frontend({"do_sample": False, "temperature": 0.7}).sampling_defaults == {"temperature": 0.0}
    assert _frontend({}).sampling_defaults == {}


def test_http_request_fields_override_model_defaults():
    limits = ModelLimits(max_model_len=64, vocab_size=248077,
                         sampling_defaults={"temperature": 0.6, "top_k": 20, "top_p": 0.95})
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                "top_p": 0.5})
    sp = sampling_params(req, limits, None, 0)
    assert (sp.temperature, sp.top_k, sp.top_p) == (0.6, 20, 0.5)
    bare = sampling_params(req, ModelLimits(max_model_len=64, vocab_size=248077), None, 0)
    assert (bare.temperature, bare.top_k, bare.top_p) == (1.0, 0, 0.5)
