"""The media flags of the CLI: `ninfer serve`'s policy flags (each bad value a one-line error naming
the flag, before any model loads), `ninfer generate --image/--video`, and chat's /image and /video."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ninfer.gateway import media as M
from ninfer.gateway.cli import cmd_chat, cmd_generate, cmd_serve
from ninfer.gateway.cli.main import build_parser, main
from support.media_util import image_bytes, video_bytes

IMAGE_PAD_ID, VIDEO_PAD_ID = 248056, 248057


def _serve_args(*argv: str) -> argparse.Namespace:
    parser, _ = build_parser()
    return parser.parse_args(["serve", *argv])


def _one_line_error(capsys, argv: list[str], words: str, code: int = 2) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert err.startswith(f"ninfer {argv[0]}: error: ")


def test_serve_media_flags_make_the_policy(tmp_path):
    policy = cmd_serve.media_policy(_serve_args(
        "--allowed-media-domains", "img.example.com", "CDN.example.org", "--allowed-local-media-path", str(tmp_path),
        "--limit-mm-per-prompt", '{"image": 3, "video": 0}', "--max-image-pixels", "1000000",
        "--max-video-frames", "16", "--video-fps", "1.5", "--media-fetch-timeout-s", "2.5",
        "--max-media-bytes", "4096", "--max-media-redirects", "0"))
    assert policy.allowed_domains == ("img.example.com", "cdn.example.org") and not policy.allow_remote
    assert policy.allowed_local_path == tmp_path.resolve()
    assert policy.limits == M.MediaLimits(per_prompt={"image": 3, "video": 0}, max_image_pixels=1_000_000,
                                          max_video_frames=16, video_fps=1.5)
    assert (policy.timeout_s, policy.max_bytes, policy.max_redirects) == (2.5, 4096, 0)
    default = cmd_serve.media_policy(_serve_args())
    assert default == M.MediaPolicy() and not default.remote and default.allowed_local_path is None
    assert cmd_serve.media_policy(_serve_args("--allow-remote-media")).remote


@pytest.mark.parametrize("flags, words", [
    (["--limit-mm-per-prompt", "{bad"], "--limit-mm-per-prompt: not JSON"),
    (["--limit-mm-per-prompt", '{"audio": 1}'], "--limit-mm-per-prompt: unknown modality 'audio'"),
    (["--limit-mm-per-prompt", '{"image": -2}'], "--limit-mm-per-prompt: 'image' must be an integer >= 0"),
    (["--max-image-pixels", "lots"], "--max-image-pixels must be an integer >= 1, got 'lots'"),
    (["--max-image-pixels", "0"], "--max-image-pixels must be an integer >= 1"),
    (["--max-video-frames", "-1"], "--max-video-frames must be an integer >= 1"),
    (["--video-fps", "0"], "--video-fps must be in (0, 120]"),
    (["--video-fps", "fast"], "--video-fps must be a number"),
    (["--media-fetch-timeout-s", "0"], "--media-fetch-timeout-s must be > 0"),
    (["--max-media-redirects", "-1"], "--max-media-redirects must be an integer >= 0"),
    (["--allowed-local-media-path", "/no/such/dir"], "--allowed-local-media-path '/no/such/dir' is not a directory"),
    (["--allowed-media-domains", "https://img.example.com/"], "--allowed-media-domains takes host names"),
])
def test_serve_media_flag_errors_are_one_line(capsys, flags, words):
    _one_line_error(capsys, ["serve", *flags, "--port", "0"], words)


@pytest.fixture()
def files(tmp_path) -> dict[str, Path]:
    out = {"png": tmp_path / "a.png", "jpg": tmp_path / "b.jpg", "mp4": tmp_path / "c.mp4",
           "bad": tmp_path / "bad.png"}
    out["png"].write_bytes(image_bytes("PNG"))
    out["jpg"].write_bytes(image_bytes("JPEG", (16, 16)))
    out["mp4"].write_bytes(video_bytes(frames=12))
    out["bad"].write_bytes(b"not an image")
    return out


def test_generate_media_flag_errors(capsys, files, tmp_path):
    _one_line_error(capsys, ["generate", "-p", "hi", "--image", str(files["png"])], "--image needs --chat")
    _one_line_error(capsys, ["generate", "-p", "hi", "--video", str(files["mp4"])], "--video needs --chat")
    _one_line_error(capsys, ["generate", "-p", "hi", "--chat", "--video", str(files["mp4"]), "--video",
                             str(files["mp4"])], "--video may be given once")
    _one_line_error(capsys, ["generate", "-p", "hi", "--chat", "--image", str(tmp_path / "nope.png")],
                    f"--image {tmp_path / 'nope.png'}: {tmp_path / 'nope.png'}: no such file")
    _one_line_error(capsys, ["generate", "-p", "hi", "--chat", "--image", str(files["bad"])],
                    "not a supported format")
    _one_line_error(capsys, ["generate", "-p", "hi", "--chat", "--video", str(files["png"])], "--video")


def test_generate_puts_the_media_before_the_prompt(files):
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    parser, _ = build_parser()
    args = parser.parse_args(["generate", "-p", "Describe.", "--chat", "--image", str(files["png"]),
                              "--image", str(files["jpg"]), "--video", str(files["mp4"])])
    assert args.image == [str(files["png"]), str(files["jpg"])] and args.video == [str(files["mp4"])]
    parts = cmd_generate.media_parts(args.image, args.video)
    assert [p["type"] for p in parts] == ["image", "image", "video"]
    assert parts[0][M.MEDIA_KEY].size == (32, 24) and parts[2][M.MEDIA_KEY].frames.shape[0] == 4

    class _Engine:
        frontend = Qwen36Frontend.builtin()
    prompt, _ = cmd_generate._prompt(_Engine(), args, parts)
    ids = list(prompt.token_ids)
    # NOTE: each placeholder expands to one pad per merged patch; a video to one run per temporal group
    assert ids.count(IMAGE_PAD_ID) == sum(m.length for m in prompt.media if m.kind == "image")
    assert ids.count(VIDEO_PAD_ID) == sum(m.length for m in prompt.media if m.kind == "video") > 0
    assert ids.index(VIDEO_PAD_ID) < len(ids) - 3 and [m.kind for m in prompt.media][:2] == ["image", "image"]
    assert {m.kind for m in prompt.media[2:]} == {"video"}


def test_chat_image_and_video_commands(capsys, files):
    parser, _ = build_parser()
    session = cmd_chat.ChatSession(engine=None, args=parser.parse_args(["chat"]))
    assert session.command(f"/image {files['png']}")
    assert f"[image attached to the next message: {files['png']} (32x24)]" in capsys.readouterr().out
    assert session.command(f"/video {files['mp4']}")
    assert "[video attached" in capsys.readouterr().out
    assert [p["type"] for p in session.attached] == ["image", "video"]
    assert session.command("/image")
    assert "usage: /image PATH" in capsys.readouterr().out
    assert session.command(f"/image {files['bad']}")
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "not a supported format" in err and len(err.splitlines()) == 1
    assert len(session.attached) == 2
    assert session.command("/reset") and session.attached == []
    assert "/image PATH" in cmd_chat.HELP


def test_chat_sends_the_attachment_with_the_next_message(capsys, files):
    from ninfer.config import EngineConfig
    from ninfer.engine.facade import Engine
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
    from support.fakes import FakeProgram

    engine = Engine.from_program(FakeProgram(num_pages=64, page_size=16, max_model_len=512, vocab=5000),
                                 Qwen36Frontend.builtin(), EngineConfig(max_model_len=512))
    try:
        assert engine.wait_ready(10).ready
        parser, _ = build_parser()
        session = cmd_chat.ChatSession(engine, parser.parse_args(["chat", "--max-tokens", "2"]))
        session.command(f"/image {files['png']}")
        capsys.readouterr()
        session.answer("What is in it?")
        # NOTE: the Engine refuses media until vision is wired: the turn is dropped with one error line
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "image" in err and len(err.splitlines()) == 1
        assert session.attached == [] and session.history == []
        session.answer("Hello")
        assert len(session.history) == 2 and session.history[0]["content"] == "Hello"
    finally:
        engine.close()
