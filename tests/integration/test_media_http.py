"""Image and video parts over HTTP (FastAPI TestClient over the app factory, the real Qwen3.6 Frontend,
a FakeProgram behind the public Engine): every bad input is a 400 in the OpenAI envelope naming the
part, a valid part reaches the Frontend's prepare_chat as a decoded MediaItem (and the Engine then
refuses media with a 400), and a server with default flags fetches no URL and reads no file."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from ninfer.config import EngineConfig
from ninfer.gateway import media as M
from ninfer.targets.qwen3_6.frontend.vision_preprocess import VisionPreprocessConfig, preprocess_image
from support.fakes import FakeProgram
from support.media_util import RecordingServer, data_url, image_bytes, png_claiming, send_body, video_bytes

IMAGE_PAD_ID = 248056
PNG = image_bytes("PNG", (32, 24), (10, 20, 30))
PNG_URL = data_url(PNG, "image/png")
# NOTE: the Frontend expands an image's placeholder to one pad per merged patch
PER = preprocess_image(PNG, VisionPreprocessConfig.from_dicts()).num_tokens(2)
MP4_URL = data_url(video_bytes(frames=20, fps=10), "video/mp4")


@pytest.fixture(scope="module")
def app_parts():
    from fastapi.testclient import TestClient

    from ninfer.engine.facade import Engine
    from ninfer.gateway.http.app import create_app
    from ninfer.gateway.http.state import GatewayState
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    prog = FakeProgram(num_pages=64, page_size=16, max_model_len=512, vocab=5000)
    engine = Engine.from_program(prog, Qwen36Frontend.builtin(), EngineConfig(max_model_len=512))
    assert engine.wait_ready(10).ready
    state = GatewayState(model_name="m")
    state.attach(engine)
    try:
        with TestClient(create_app(state)) as c:
            yield c, state, engine
    finally:
        engine.close()


@pytest.fixture()
def client(app_parts):
    c, state, engine = app_parts
    state.media = M.MediaPolicy()
    yield c, state
    state.media = M.MediaPolicy()


@pytest.fixture()
def seen(app_parts, monkeypatch):
    """The messages the Frontend's prepare_chat receives."""
    _, _, engine = app_parts
    fe = engine.frontend
    got: list = []
    real = fe.prepare_chat

    def spy(messages, *a, **kw):
        got.append(messages)
        return real(messages, *a, **kw)
    monkeypatch.setattr(fe, "prepare_chat", spy)
    return got


def chat(*content, system=None, **extra) -> dict:
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": list(content)}]
    return {"model": "m", "messages": msgs, "max_tokens": 4, **extra}


def image(url) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def video(url) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


TEXT = {"type": "text", "text": "What is this?"}


def assert_400(r, param: str, words: str) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert words.lower() in err["message"].lower(), err
    assert "Traceback" not in err["message"]
    return err


def test_a_valid_image_and_video_reach_the_frontend_then_the_engine_refuses_media(client, seen):
    c, _ = client
    r = c.post("/v1/chat/completions", json=chat(image(PNG_URL), TEXT, video(MP4_URL)))
    assert r.status_code == 400 and "image or video input" in r.json()["error"]["message"], r.text
    parts = seen[-1][-1]["content"]
    assert [p["type"] for p in parts] == ["image", "text", "video"]
    img, vid = parts[0][M.MEDIA_KEY], parts[2][M.MEDIA_KEY]
    assert isinstance(img, M.MediaItem) and img.size == (32, 24) and img.source == "data:image/png"
    assert np.asarray(img.image)[0, 0].tolist() == [10, 20, 30]
    assert vid.kind == "video" and vid.frames.shape == (4, 48, 64, 3) and vid.frame_indices == (0, 6, 13, 19)
    assert parts[1] == {"type": "text", "text": "What is this?"}


def test_tokenize_counts_the_placeholders(client, seen):
    c, _ = client
    r = c.post("/tokenize", json={"model": "m", "messages": chat(image(PNG_URL), image(PNG_URL), TEXT)["messages"]})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"].count(IMAGE_PAD_ID) == 2 * PER
    assert [p.get(M.MEDIA_KEY) is not None for p in seen[-1][-1]["content"]] == [True, True, False]


def test_text_only_messages_are_unchanged(client, seen):
    c, _ = client
    r = c.post("/v1/chat/completions", json=chat(TEXT, {"type": "text", "text": "Two lines"}))
    assert r.status_code == 200, r.text
    assert seen[-1][-1]["content"] == "What is this?\nTwo lines"


@pytest.mark.parametrize("content, param, words", [
    ([TEXT, image("data:image/png;base64,!!!")], "messages[0].content[1].image_url", "not valid base64"),
    ([image("data:image/png,rawbytes")], "messages[0].content[0].image_url", "must be base64"),
    ([image(data_url(b"not an image at all", "image/png"))], "messages[0].content[0].image_url",
     "not a supported format"),
    ([image(data_url(image_bytes("TIFF"), "image/tiff"))], "messages[0].content[0].image_url",
     "not a supported format"),
    ([image(data_url(PNG[:40], "image/png"))], "messages[0].content[0].image_url", "corrupt"),
    ([image(data_url(image_bytes("JPEG", (64, 64))[:300], "image/jpeg"))], "messages[0].content[0].image_url",
     "truncated"),
    ([image(data_url(png_claiming(100_000, 100_000), "image/png"))], "messages[0].content[0].image_url",
     "over the limit of"),
    ([TEXT, TEXT, image("gopher://x/a.png")], "messages[0].content[2].image_url", "unsupported URL scheme"),
    ([{"type": "image_url", "image_url": {"detail": "high"}}], "messages[0].content[0].image_url", "`url` string"),
    ([{"type": "image_url"}], "messages[0].content[0].image_url", "`url` string"),
    ([video(data_url(b"garbage video", "video/mp4"))], "messages[0].content[0].video_url", "not a supported format"),
    ([video(data_url(video_bytes()[:500], "video/mp4"))], "messages[0].content[0].video_url", "corrupt"),
    ([video(PNG_URL)], "messages[0].content[0].video_url", "video"),
    ([{"type": "input_audio", "input_audio": {"data": "x"}}], "messages[0].content[0].type", "not supported"),
], ids=["bad-base64", "not-base64", "not-an-image", "tiff", "png-cut", "jpeg-cut", "bomb", "scheme",
        "no-url", "no-field", "bad-video", "video-cut", "image-as-video", "audio"])
def test_bad_inputs_are_400_naming_the_part(client, content, param, words):
    c, _ = client
    assert_400(c.post("/v1/chat/completions", json=chat(*content)), param, words)


def test_image_in_a_system_message(client):
    c, _ = client
    body = {"model": "m", "messages": [
        {"role": "system", "content": [TEXT, image(PNG_URL)]},
        {"role": "user", "content": "hi"}]}
    assert_400(c.post("/v1/chat/completions", json=body), "messages[0].content[1].image_url",
               "system message cannot contain images")
    body["messages"][0]["role"] = "developer"
    assert_400(c.post("/v1/chat/completions", json=body), "messages[0].content[1].image_url", "cannot contain")


def test_limits_set_at_start(client):
    c, state = client
    state.media = M.MediaPolicy(limits=M.MediaLimits(per_prompt={"image": 1, "video": 0}, max_image_pixels=500))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
                                       {"role": "user", "content": [image(PNG_URL), TEXT, image(PNG_URL)]}]}
    assert_400(c.post("/v1/chat/completions", json=body), "messages[2].content[2].image_url",
               "at most 1 image(s) per prompt")
    assert_400(c.post("/v1/chat/completions", json=chat(video(MP4_URL))), "messages[0].content[0].video_url",
               "at most 0 video(s)")
    assert_400(c.post("/v1/chat/completions", json=chat(TEXT, image(PNG_URL))), "messages[0].content[1].image_url",
               "32x24 = 768 pixels, over the limit of 500")


def test_default_flags_fetch_no_url_and_read_no_file(client, tmp_path):
    c, state = client
    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG)
    with RecordingServer({"/a.png": send_body(PNG, "image/png")}) as srv:
        for url, words in [(f"{srv.base}/a.png", "remote media URLs are not allowed"),
                           (f"http://localhost:{srv.port}/a.png", "remote media URLs are not allowed"),
                           (f"file://{secret}", "local files are not allowed"),
                           (str(secret), "local files are not allowed")]:
            assert_400(c.post("/v1/chat/completions", json=chat(TEXT, image(url))), "messages[0].content[1].image_url",
                       words)
            assert_400(c.post("/v1/chat/completions", json=chat(video(url))), "messages[0].content[0].video_url",
                       words)
        # an allowed domain whose address is loopback is refused too (no SSRF), still without a request
        state.media = M.MediaPolicy(allowed_domains=("localhost",))
        assert_400(c.post("/v1/chat/completions", json=chat(image(f"http://localhost:{srv.port}/a.png"))),
                   "messages[0].content[0].image_url", "loopback address")
        assert srv.requests == []
        # the same server is reachable when a policy lets it be (the check above is not vacuous)
        state.media = M.MediaPolicy(allow_remote=True, allow_private_addresses=True)
        r = c.post("/tokenize", json={"model": "m", "messages": chat(image(f"{srv.base}/a.png"))["messages"]})
        assert r.status_code == 200 and r.json()["tokens"].count(IMAGE_PAD_ID) == PER, r.text
        assert srv.requests == ["/a.png"]


def test_count_limits_are_checked_before_any_fetch(client):
    c, state = client
    with RecordingServer({"/a.png": send_body(PNG)}) as srv:
        state.media = M.MediaPolicy(allow_remote=True, allow_private_addresses=True,
                                    limits=M.MediaLimits(per_prompt={"image": 1, "video": 1}))
        assert_400(c.post("/v1/chat/completions", json=chat(image(f"{srv.base}/a.png"), image(f"{srv.base}/a.png"))),
                   "messages[0].content[1].image_url", "at most 1 image(s)")
        assert srv.requests == []


def test_local_path_flag_allows_only_its_directory(client, tmp_path):
    c, state = client
    root = tmp_path / "allowed"
    root.mkdir()
    (root / "a.png").write_bytes(PNG)
    (tmp_path / "b.png").write_bytes(PNG)
    state.media = M.MediaPolicy(allowed_local_path=root)
    ok = c.post("/tokenize", json={"model": "m", "messages": chat(image(f"file://{root}/a.png"))["messages"]})
    assert ok.status_code == 200, ok.text
    assert_400(c.post("/v1/chat/completions", json=chat(image(f"file://{root}/../b.png"))),
               "messages[0].content[0].image_url", "outside the allowed media path")


def test_bad_requests_leak_no_thread_or_descriptor(client):
    c, _ = client
    bad = [chat(image(data_url(b"junk", "image/png"))), chat(video(data_url(video_bytes()[:500], "video/mp4"))),
           chat(image("http://127.0.0.1:9/a.png"))]
    for body in bad:
        c.post("/v1/chat/completions", json=body)
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for _ in range(4):
        for body in bad:
            assert c.post("/v1/chat/completions", json=body).status_code == 400
    deadline = time.monotonic() + 3.0
    while (len(os.listdir("/proc/self/fd")) > fds or threading.active_count() > threads) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(os.listdir("/proc/self/fd")) <= fds and threading.active_count() <= threads


def test_streamed_requests_get_the_same_400_before_any_event(client):
    c, _ = client
    r = c.post("/v1/chat/completions", json=chat(image(data_url(b"junk", "image/png")), stream=True))
    assert r.headers["content-type"].startswith("application/json")
    assert_400(r, "messages[0].content[0].image_url", "not a supported format")


def test_media_in_any_turn_of_the_conversation(client, seen):
    c, _ = client
    body = {"model": "m", "messages": [
        {"role": "user", "content": [image(PNG_URL), TEXT]},
        {"role": "assistant", "content": "A red square."},
        {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                     {"type": "image_url", "image_url": PNG_URL}]}]}
    r = c.post("/tokenize", json=body)
    assert r.status_code == 200 and r.json()["tokens"].count(IMAGE_PAD_ID) == 2 * PER, r.text
    first, last = seen[-1][0]["content"], seen[-1][2]["content"]
    assert first[0][M.MEDIA_KEY].digest == last[1][M.MEDIA_KEY].digest      # the same bytes, the same identity
