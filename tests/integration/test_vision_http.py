"""Images and video over HTTP end to end: `ninfer serve` of a tiny vision-language artifact, the official `openai`
client sending an image and a video as data URLs, answered streamed and not (the same greedy text both ways)."""
from __future__ import annotations

import openai
import pytest

from support.media_util import data_url, image_bytes, video_bytes
from support.serve_util import serving


@pytest.fixture(scope="module")
def client(tiny_artifact_path):
    with serving(str(tiny_artifact_path("dense")), "--max-model-len", "1024", "--max-concurrency", "2",
                 "--served-model-name", "m") as s:
        yield openai.OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0, timeout=120)


def test_openai_client_sends_an_image_and_a_video(client):
    content = [{"type": "image_url", "image_url": {"url": data_url(image_bytes("PNG", (48, 40), (200, 10, 30)),
                                                                    "image/png")}},
               {"type": "text", "text": "What is in the picture and the clip?"},
               {"type": "video_url", "video_url": {"url": data_url(video_bytes(frames=12, fps=6), "video/mp4")}}]
    kw = dict(model="m", messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0.0,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True})
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 100                      # the placeholders expanded
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                   if c.choices)
    assert text == r.choices[0].message.content
