"""Media decoding (ninfer/gateway/media/): images in each supported format, videos sampled as
transformers' Qwen3-VL processor samples them, and every bad input refused with a MediaError that
names the problem (unsupported, corrupt, truncated, over a limit, a decompression bomb's header)."""
from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest

from ninfer.gateway import media as M
from support.media_util import data_url, image_bytes, png_claiming, video_bytes

POLICY = M.MediaPolicy()


@pytest.mark.parametrize("fmt, mime", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"),
                                       ("GIF", "image/gif"), ("BMP", "image/bmp")])
def test_each_image_format_decodes_to_rgb(fmt, mime):
    raw = image_bytes(fmt, (33, 17), (200, 30, 40))
    item = M.load_media("image", data_url(raw, mime), POLICY)
    assert item.kind == "image" and item.image.mode == "RGB" and item.size == (33, 17)
    assert item.digest == hashlib.sha256(raw).hexdigest() and item.source == f"data:{mime}"
    px = np.asarray(item.image)[5, 5].astype(int)
    assert np.abs(px - (200, 30, 40)).max() <= (12 if fmt in ("JPEG", "WEBP") else 2)
    assert item.frames is None


def test_gif_gives_its_first_frame_and_rgba_becomes_rgb():
    item = M.load_media("image", image_bytes("GIF", (8, 8), (255, 0, 0)), POLICY)
    r, g, b = np.asarray(item.image)[0, 0]
    assert r > 200 and b < 50                      # red first frame, not the blue second one
    rgba = M.load_media("image", image_bytes("PNG", (4, 4), (1, 2, 3, 0), mode="RGBA"), POLICY)
    assert rgba.image.mode == "RGB"


def test_different_images_have_different_digests_the_same_bytes_the_same():
    a, b = image_bytes(color=(1, 2, 3)), image_bytes(color=(3, 2, 1))
    assert M.load_media("image", a, POLICY).digest != M.load_media("image", b, POLICY).digest
    assert M.load_media("image", a, POLICY).digest == M.load_media("image", data_url(a, "image/png"), POLICY).digest


@pytest.mark.parametrize("data, words", [
    (b"GIF89a-not-really", "not a supported format"),
    (b"hello world, not an image", "not a supported format"),
    (image_bytes("TIFF"), "not a supported format"),                # Pillow reads it; we do not take it
    (image_bytes("PNG", (64, 64))[:60], "corrupt"),                   # truncated
    (image_bytes("JPEG", (64, 64))[:200], "truncated"),
], ids=["gif-magic-only", "text", "tiff", "png-cut", "jpeg-cut"])
def test_bad_images_are_refused(data, words):
    with pytest.raises(M.MediaError, match=words):
        M.load_media("image", data, POLICY)


def test_a_decompression_bomb_is_refused_from_its_header():
    bomb = png_claiming(100_000, 100_000)            # 10^10 pixels claimed, a few bytes of data
    t0 = time.perf_counter()
    with pytest.raises(M.MediaError, match=r"10000000000 pixels, over the limit of 50000000"):
        M.load_media("image", bomb, POLICY)
    with pytest.raises(M.MediaError, match=r"9000x9000 = 81000000 pixels, over the limit of 50000000"):
        M.load_media("image", png_claiming(9000, 9000), POLICY)      # under Pillow's own guard: ours
    assert time.perf_counter() - t0 < 1.0
    small = M.MediaPolicy(limits=M.MediaLimits(max_image_pixels=999))
    with pytest.raises(M.MediaError, match="32x32 = 1024 pixels, over the limit of 999"):
        M.load_media("image", image_bytes(size=(32, 32)), small)
    M.load_media("image", image_bytes(size=(27, 37)), small)


@pytest.mark.parametrize("url, words", [
    ("data:image/png,abc", "must be base64"),
    ("data:image/png;base64", "no ','"),
    ("data:image/png;base64,!!!!", "not valid base64"),
    ("data:image/png;base64,", "empty"),
    ("ftp://example.com/a.png", "unsupported URL scheme 'ftp'"),
])
def test_bad_data_urls(url, words):
    with pytest.raises(M.MediaError, match=words):
        M.load_media("image", url, POLICY)


def test_data_url_over_the_byte_cap():
    policy = M.MediaPolicy(max_bytes=100)
    with pytest.raises(M.MediaError, match="larger than the limit of 100 bytes"):
        M.load_media("image", data_url(image_bytes(size=(64, 64), color=None) + b"\0" * 200, "image/png"), policy)


def test_python_api_sources_pil_and_arrays():
    from PIL import Image

    arr = np.zeros((6, 10, 3), np.uint8)
    arr[..., 1] = 255
    a = M.load_media("image", arr, POLICY)
    p = M.load_media("image", Image.fromarray(arr), POLICY)
    assert a.size == p.size == (10, 6) and np.array_equal(np.asarray(a.image), arr)
    v = M.load_media("video", np.zeros((5, 4, 6, 3), np.uint8), POLICY)
    assert v.frames.shape == (5, 4, 6, 3) and v.frame_indices == (0, 1, 2, 3, 4)
    with pytest.raises(M.MediaError, match=r"uint8 \[H, W, 3\] RGB, got float32"):
        M.load_media("image", arr.astype(np.float32), POLICY)
    with pytest.raises(M.MediaError, match=r"\[T, H, W, 3\]"):
        M.load_media("video", arr, POLICY)


# ---------------------------------------------------------------------------------------------
# Video
# ---------------------------------------------------------------------------------------------
def _transformers_indices(total: int, src_fps: float, fps: float, max_frames: int) -> list[int]:
    """transformers' Qwen3-VL sampling rule (video_processing_qwen3_vl.sample_frames), restated."""
    n = int(total / src_fps * fps)
    n = min(max(n, 4), max_frames, total)
    return [int(i) for i in np.linspace(0, total - 1, n).round().astype(int)]


@pytest.mark.parametrize("fmt, codec, mime", [("mp4", "libx264", "video/mp4"), ("mp4", "mpeg4", "video/mp4"),
                                              ("webm", "libvpx", "video/webm")])
def test_video_formats_decode_and_sample_like_transformers(fmt, codec, mime):
    raw = video_bytes(fmt, codec, frames=30, size=(64, 48), fps=10)
    item = M.load_media("video", data_url(raw, mime), POLICY)
    assert item.kind == "video" and item.frames.dtype == np.uint8 and item.size == (64, 48)
    assert item.total_frames == 30 and item.source_fps == pytest.approx(10.0)
    assert list(item.frame_indices) == _transformers_indices(30, 10, 2.0, 256) == [0, 6, 12, 17, 23, 29]
    assert item.frames.shape == (6, 48, 64, 3)
    # frame i is gray level 8*i: the kept frames are the indexed ones, in order
    levels = item.frames[:, 10, 10, 0].astype(int)
    assert np.abs(levels - 8 * np.array(item.frame_indices)).max() <= 6
    assert item.digest == hashlib.sha256(raw).hexdigest()


def test_video_sampling_limits():
    raw = video_bytes(frames=40, fps=10)
    few = M.load_media("video", raw, M.MediaPolicy(limits=M.MediaLimits(max_video_frames=5)))
    assert list(few.frame_indices) == _transformers_indices(40, 10, 2.0, 5) and few.frames.shape[0] == 5
    dense = M.load_media("video", raw, M.MediaPolicy(limits=M.MediaLimits(video_fps=10)))
    assert list(dense.frame_indices) == list(range(40))
    short = M.load_media("video", video_bytes(frames=3, fps=10), POLICY)  # fewer frames than the minimum 4
    assert list(short.frame_indices) == [0, 1, 2]
    # the kept frames x frame pixels budget clamps the count too
    budget = M.MediaPolicy(limits=M.MediaLimits(max_video_pixels=64 * 48 * 5))
    assert len(M.load_media("video", raw, budget).frame_indices) == 5
    # the video's own frames x frame pixels bound the decode work
    work = M.MediaPolicy(limits=M.MediaLimits(max_video_decode_pixels=64 * 48 * 39))
    with pytest.raises(M.MediaError, match="too long to decode: 40 frames of 64x48"):
        M.load_media("video", raw, work)


@pytest.mark.parametrize("make, words", [
    (lambda: video_bytes()[:400], "not a supported format|corrupt"),         # mp4 cut before its index
    (lambda: b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 50, "not a supported format|corrupt|no video"),
    (lambda: image_bytes("PNG"), "not supported|no video|not a supported format"),
    (lambda: b"random bytes that are no container", "not a supported format"),
], ids=["mp4-cut", "ftyp-only", "png", "garbage"])
def test_bad_videos_are_refused(make, words):
    with pytest.raises(M.MediaError, match=words):
        M.load_media("video", make(), POLICY)


def test_video_frame_size_is_checked_from_the_header():
    policy = M.MediaPolicy(limits=M.MediaLimits(max_image_pixels=64 * 48 - 1))
    with pytest.raises(M.MediaError, match="video frame is 64x48 = 3072 pixels, over the limit of 3071"):
        M.load_media("video", video_bytes(), policy)


def test_limit_mm_per_prompt_parsing():
    assert M.parse_limit_mm_per_prompt('{"image": 4, "video": 0}') == {"image": 4, "video": 0}
    assert M.parse_limit_mm_per_prompt('{"image": {"count": 3}, "video": 2}') == {"image": 3, "video": 2}
    assert M.parse_limit_mm_per_prompt('{"image": 2}') == {"image": 2, "video": M.DEFAULT_LIMIT_PER_PROMPT["video"]}
    for text, words in [("{bad", "not JSON"), ("[1]", "JSON object"), ('{"audio": 1}', "unknown modality"),
                        ('{"image": -1}', ">= 0"), ('{"image": 1.5}', ">= 0"), ('{"image": true}', ">= 0")]:
        with pytest.raises(ValueError, match=words):
            M.parse_limit_mm_per_prompt(text)


def test_attach_media_for_python_api_messages(tmp_path):
    from PIL import Image

    png = image_bytes()
    (tmp_path / "a.png").write_bytes(png)
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "image", "image": png}, {"type": "image", "image": Image.new("RGB", (5, 4))},
                {"type": "image", "image": np.zeros((3, 2, 3), np.uint8)},
                {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
                {"type": "image", "path": "a.png"}, {"type": "text", "text": "and"},
                {"type": "video", "video": video_bytes(frames=8)}]}]
    policy = M.MediaPolicy(allowed_local_path=tmp_path)
    out = M.attach_media(msgs, policy)
    assert out[0] is msgs[0] and msgs[1]["content"][0] == {"type": "image", "image": png}   # input untouched
    parts = out[1]["content"]
    assert [p["type"] for p in parts] == ["image"] * 5 + ["text", "video"]
    assert [p[M.MEDIA_KEY].size for p in parts[:5]] == [(32, 24), (5, 4), (2, 3), (32, 24), (32, 24)]
    assert parts[0][M.MEDIA_KEY].digest == parts[3][M.MEDIA_KEY].digest == parts[4][M.MEDIA_KEY].digest
    assert parts[6][M.MEDIA_KEY].frames.shape[0] == 4
    assert M.attach_media(out, policy)[1]["content"][0] is parts[0]          # already attached: kept
    with pytest.raises(M.MediaPartError, match=r"messages\[1\].content\[4\]: local files are not allowed") as e:
        M.attach_media(msgs, M.MediaPolicy())
    assert e.value.param == "messages[1].content[4]"
    with pytest.raises(M.MediaPartError, match=r"messages\[1\].content\[1\]: at most 1 image"):
        M.attach_media(msgs, M.MediaPolicy(limits=M.MediaLimits(per_prompt={"image": 1, "video": 1})))
    with pytest.raises(M.MediaPartError, match=r"messages\[0\].content\[0\]: a system message cannot contain images"):
        M.attach_media([{"role": "system", "content": [{"type": "image", "image": png}]}], policy)


@pytest.mark.parametrize("kind, make", [
    ("image", lambda: image_bytes("PNG", (16, 16))), ("image", lambda: image_bytes("JPEG", (16, 16))),
    ("image", lambda: image_bytes("GIF", (16, 16))), ("image", lambda: image_bytes("WEBP", (16, 16))),
    ("image", lambda: image_bytes("BMP", (16, 16))), ("video", lambda: video_bytes(frames=6)),
    ("video", lambda: video_bytes("webm", "libvpx", frames=6)),
], ids=["png", "jpeg", "gif", "webp", "bmp", "mp4", "webm"])
def test_mutated_bytes_decode_or_raise_media_error_only(kind, make):
    """Seeded byte flips, cuts and splices: each input decodes or is a MediaError, never another exception."""
    raw = make()
    rng = np.random.default_rng(1234)
    for _ in range(40):
        data = bytearray(raw)
        op = rng.integers(3)
        if op == 0:
            for pos in rng.integers(0, len(data), size=int(rng.integers(1, 8))):
                data[pos] = int(rng.integers(256))
        elif op == 1:
            data = data[:int(rng.integers(1, len(data)))]
        else:
            a = int(rng.integers(0, len(data)))
            data[a:a] = bytes(rng.integers(0, 256, size=int(rng.integers(1, 64)), dtype=np.uint8))
        try:
            item = M.load_media(kind, bytes(data), POLICY)
        except M.MediaError:
            continue
        assert item.kind == kind
