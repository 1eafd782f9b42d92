"""Host-side image/video preprocessing equals transformers' Qwen3.6 processors, and bad media are refused.

Oracles: transformers 5.24's `Qwen2VLImageProcessorPil` (images, the PIL backend) and
`Qwen3VLVideoProcessor` / `Qwen3VLProcessor` (videos, timestamps, prompt text). The video processor
runs on torchvision, which this environment lacks (the only local wheels are CUDA builds), so its
three torchvision calls (`resize`, `normalize`, `grayscale_to_rgb`) are replaced by what torchvision
0.28 does on a CPU tensor: a uint8 bicubic resize runs `torch.nn.functional.interpolate(...,
antialias=True)` on the uint8 tensor, normalize is `sub_(mean).div_(std)`. Everything else
(frame sampling, metadata, smart_resize, the fused rescale/normalize, padding, patch order) is the
processor's own code.
"""
from __future__ import annotations

import enum
import importlib
import io
import json
import shutil
import struct
import sys
import types
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from ninfer.targets.qwen3_6.frontend.resample import resize_uint8_bicubic_torch
from ninfer.targets.qwen3_6.patch_rows import PatchRows
from ninfer.targets.qwen3_6.frontend.video_preprocess import frame_timestamps, preprocess_video, sample_frame_indices
from ninfer.targets.qwen3_6.frontend.vision_preprocess import (
    FAMILY_IMAGE_CONFIG, FAMILY_VIDEO_CONFIG, ImageInput, VideoInput, VisionPreprocessConfig, image_placeholder_text,
    num_placeholder_tokens, preprocess_image, smart_resize, smart_resize_video, video_groups, video_placeholder_text)

FAMILY = VisionPreprocessConfig.from_dicts(FAMILY_IMAGE_CONFIG, FAMILY_VIDEO_CONFIG)
RNG = np.random.default_rng(1234)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---------------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_image():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    def make(cfg: dict = FAMILY_IMAGE_CONFIG):
        return Qwen2VLImageProcessorPil.from_dict({**cfg, "image_processor_type": "Qwen2VLImageProcessorFast"})
    return make


class _Mode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _tv_resize(image, size, interpolation=_Mode.BILINEAR, antialias=True):
    """torchvision 0.28 resize_image on a CPU uint8 tensor with bicubic: interpolate natively in uint8."""
    assert interpolation is _Mode.BICUBIC and image.dtype == torch.uint8
    shape = image.shape
    c, h, w = shape[-3:]
    if tuple(size) == (h, w):
        return image
    out = torch.nn.functional.interpolate(image.reshape(-1, c, h, w), size=list(size), mode="bicubic",
                                          align_corners=False, antialias=antialias)
    return out.reshape(shape[:-3] + (c, *size))


def _tv_normalize(t, mean, std, inplace=False):
    t = t if inplace else t.clone()
    return t.sub_(torch.as_tensor(mean, dtype=t.dtype).view(-1, 1, 1)).div_(
        torch.as_tensor(std, dtype=t.dtype).view(-1, 1, 1))


_FAST_IMAGE_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"


@pytest.fixture(scope="module")
def torchvision_backend():
    """transformers' torchvision-backed classes with the torchvision calls stood in: yields
    (Qwen3VLVideoProcessor class, Qwen3VLProcessor class, Qwen2VLImageProcessor (the Fast) class)."""
    import transformers.image_processing_backends as ipb
    import transformers.video_processing_utils as vpu
    from transformers.image_utils import PILImageResampling

    shim = types.ModuleType("torchvision.transforms.v2.functional")
    shim.InterpolationMode, shim.resize, shim.normalize = _Mode, _tv_resize, _tv_normalize
    shim.grayscale_to_rgb = lambda x: x
    mp = pytest.MonkeyPatch()
    mp.setattr(ipb, "tvF", shim, raising=False)
    mp.setattr(vpu, "tvF", shim, raising=False)
    mp.setattr(ipb, "pil_torch_interpolation_mapping", {PILImageResampling.BICUBIC: _Mode.BICUBIC}, raising=False)
    # the Fast image module imports torchvision's functional at the top (for annotations only)
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2"):
        mp.setitem(sys.modules, name, types.ModuleType(name))
    mp.setitem(sys.modules, "torchvision.transforms.v2.functional", shim)
    try:
        video = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl").Qwen3VLVideoProcessor
        proc = importlib.import_module("transformers.models.qwen3_vl.processing_qwen3_vl").Qwen3VLProcessor
        fast = importlib.import_module(_FAST_IMAGE_MODULE).Qwen2VLImageProcessor
        yield video, proc, fast
    finally:
        mp.undo()
        sys.modules.pop(_FAST_IMAGE_MODULE, None)


@pytest.fixture(scope="module")
def hf_video(torchvision_backend):
    """(make_video_processor(cfg), Qwen3VLProcessor class, Qwen3VLVideoProcessor class)."""
    video, proc, _ = torchvision_backend

    def make(cfg: dict = FAMILY_VIDEO_CONFIG):
        return video(**cfg)
    return make, proc, video


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _hf_on_bytes(proc, data: bytes):
    return proc(images=ImageOps.exif_transpose(Image.open(io.BytesIO(data))))


def _assert_same(ours: ImageInput | VideoInput, pixel_values, grid) -> None:
    assert ours.grid_thw == tuple(int(x) for x in np.asarray(grid).reshape(-1))
    ref = np.asarray(pixel_values)
    assert ours.pixel_values.dtype == np.float32 and ours.pixel_values.shape == ref.shape
    assert _rel(ours.pixel_values, ref) < 1e-6
    assert np.array_equal(ours.pixel_values, ref)      # in fact bit-exact


# ---------------------------------------------------------------------------------------------
# smart_resize and the resampler
# ---------------------------------------------------------------------------------------------

def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_video
    sizes = [(1, 1), (7, 9), (31, 33), (100, 150), (224, 224), (37, 5000), (5000, 37), (4032, 3024),
             (8000, 8000), (16, 3200), (480, 854), (1080, 1920), (2, 400)]
    for h, w in sizes:
        for lo, hi in [(65536, 16777216), (3136, 1003520), (4096, 50000)]:
            assert smart_resize(h, w, 32, lo, hi) == hf(h, w, 32, lo, hi), (h, w, lo, hi)
            for n in (2, 3, 7, 30, 768):
                assert smart_resize_video(n, h, w, 2, 32, lo, hi) == hf_video(n, h, w, 2, 32, lo, hi), (n, h, w)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2500)
    with pytest.raises(ValueError, match="at least 2 sampled frames"):
        smart_resize_video(1, 64, 64)


@pytest.mark.parametrize("shape,out", [((2, 37, 53, 3), (64, 96)), ((1, 480, 640, 3), (224, 320)),
                                       ((3, 31, 300, 3), (32, 96)), ((2, 7, 9, 3), (64, 64)),
                                       ((1, 64, 64, 3), (64, 32)), ((1, 64, 64, 3), (40, 64))])
def test_uint8_bicubic_equals_torch_and_pillow(shape, out):
    frames = RNG.integers(0, 256, shape, dtype=np.uint8)
    ref = torch.nn.functional.interpolate(torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous(), size=out,
                                          mode="bicubic", align_corners=False, antialias=True)
    assert np.array_equal(resize_uint8_bicubic_torch(frames, *out), ref.permute(0, 2, 3, 1).numpy())
    pil = np.asarray(Image.fromarray(frames[0]).resize(out[::-1], Image.Resampling.BICUBIC))
    assert np.array_equal(resize_uint8_bicubic_torch(frames[0], *out, precision=22), pil)


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------

ARRAY_CASES = {
    "small": (100, 150),                 # upscaled to the 65536-pixel floor (224x320)
    "tiny": (7, 9),
    "odd": (37, 53),
    "very_wide": (29, 3000),
    "large": (1100, 1500),
}


@pytest.mark.parametrize("name", sorted(ARRAY_CASES))
def test_rgb_array_and_pil_image_match_transformers(hf_image, name):
    h, w = ARRAY_CASES[name]
    arr = RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)
    ref = hf_image()(images=Image.fromarray(arr))
    _assert_same(preprocess_image(arr, FAMILY), ref["pixel_values"], ref["image_grid_thw"])
    _assert_same(preprocess_image(Image.fromarray(arr), FAMILY), ref["pixel_values"], ref["image_grid_thw"])


@pytest.mark.parametrize("name", sorted(ARRAY_CASES) + ["rgba_png", "palette_gif"])
def test_torchvision_backend_matches_the_fast_processor(torchvision_backend, name):
    """image_backend="torchvision" equals Qwen2VLImageProcessor, the class the official config names."""
    fast = torchvision_backend[2](**FAMILY_IMAGE_CONFIG)
    cfg = VisionPreprocessConfig.from_dicts(None, None, image_backend="torchvision")
    if name in ARRAY_CASES:
        image = RNG.integers(0, 256, (*ARRAY_CASES[name], 3), dtype=np.uint8)
        ref = fast(images=Image.fromarray(image))
    else:
        image = ENCODED_CASES[name]()
        ref = _hf_on_bytes(fast, image)
    ours = preprocess_image(image, cfg)
    _assert_same(ours, ref["pixel_values"], ref["image_grid_thw"])
    pil = preprocess_image(image, FAMILY)
    assert pil.grid_thw == ours.grid_thw


def test_larger_than_max_pixels_is_downscaled(hf_image):
    cfg_dict = {**FAMILY_IMAGE_CONFIG, "size": {"shortest_edge": 4096, "longest_edge": 40000}}
    cfg = VisionPreprocessConfig.from_dicts(cfg_dict, None)
    arr = RNG.integers(0, 256, (300, 417, 3), dtype=np.uint8)
    ref = hf_image(cfg_dict)(images=Image.fromarray(arr))
    ours = preprocess_image(arr, cfg)
    _assert_same(ours, ref["pixel_values"], ref["image_grid_thw"])
    t, gh, gw = ours.grid_thw
    assert gh * gw * 16 * 16 <= 40000 and ours.num_tokens(2) == gh * gw // 4


def _gradient(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256],
                    axis=-1).astype(np.uint8)


def _rgba_png() -> bytes:
    rgba = np.concatenate([_gradient(60, 90), RNG.integers(0, 256, (60, 90, 1), dtype=np.uint8)], axis=-1)
    return _encode(Image.fromarray(rgba, "RGBA"), "PNG")


def _gray_png() -> bytes:
    return _encode(Image.fromarray(_gradient(70, 50)[..., 0], "L"), "PNG")


def _la_png() -> bytes:
    g = _gradient(40, 64)
    return _encode(Image.fromarray(np.stack([g[..., 0], g[..., 1]], -1), "LA"), "PNG")


def _palette_gif() -> bytes:
    frames = [Image.fromarray(_gradient(48, 80)).quantize(colors=32),
              Image.fromarray(255 - _gradient(48, 80)).quantize(colors=32)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], transparency=3, duration=100, loop=0)
    return buf.getvalue()


def _jpeg() -> bytes:
    return _encode(Image.fromarray(_gradient(123, 77)), "JPEG", quality=90)


def _jpeg_exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6                   # orientation: rotate 90 degrees clockwise to display
    return _encode(Image.fromarray(_gradient(64, 128)), "JPEG", quality=90, exif=exif.tobytes())


def _cmyk_jpeg() -> bytes:
    return _encode(Image.fromarray(_gradient(50, 70)).convert("CMYK"), "JPEG", quality=95)


def _webp() -> bytes:
    return _encode(Image.fromarray(_gradient(90, 60)), "WEBP", lossless=True)


def _bmp() -> bytes:
    return _encode(Image.fromarray(_gradient(33, 45)), "BMP")


ENCODED_CASES = {"rgba_png": _rgba_png, "gray_png": _gray_png, "la_png": _la_png, "palette_gif": _palette_gif,
                 "jpeg": _jpeg, "jpeg_exif_rotated": _jpeg_exif_rotated, "cmyk_jpeg": _cmyk_jpeg,
                 "webp": _webp, "bmp": _bmp}


@pytest.mark.parametrize("name", sorted(ENCODED_CASES))
def test_encoded_images_match_transformers(hf_image, name):
    data = ENCODED_CASES[name]()
    ref = _hf_on_bytes(hf_image(), data)
    ours = preprocess_image(data, FAMILY)
    _assert_same(ours, ref["pixel_values"], ref["image_grid_thw"])
    assert preprocess_image(bytearray(data), FAMILY).digest() == ours.digest()


def test_transparency_is_composited_onto_white():
    rgba = np.zeros((64, 64, 4), np.uint8)          # fully transparent black
    img = preprocess_image(_encode(Image.fromarray(rgba, "RGBA"), "PNG"), FAMILY)
    assert np.allclose(img.pixel_values, 1.0)        # white after (1 - 0.5) / 0.5


def test_exif_orientation_is_applied():
    img = preprocess_image(_jpeg_exif_rotated(), FAMILY)       # stored 64x128 (h x w), displayed 128x64
    assert img.grid_thw == (1, 2 * smart_resize(128, 64)[0] // 32, 2 * smart_resize(128, 64)[1] // 32)


def test_palette_image_with_transparency_as_pil_object(hf_image):
    im = Image.fromarray(_gradient(50, 50)).quantize(colors=16)
    im.info["transparency"] = 2
    ref = hf_image()(images=im)
    _assert_same(preprocess_image(im, FAMILY), ref["pixel_values"], ref["image_grid_thw"])


def test_patch_layout_is_merge_block_major():
    """A 64x64 image gives a 4x4 grid; row r of pixel_values is patch (2*bh+ih, 2*bw+iw), frame repeated."""
    arr = RNG.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    img = preprocess_image(arr, FAMILY)                 # 256x256 stays (65536 pixels), grid 16x16
    assert img.grid_thw == (1, 16, 16)
    x = ((arr.astype(np.float64) / 255).astype(np.float32) - np.float32(0.5)) / np.float32(0.5)
    rows = img.pixel_values.reshape(-1, 3, 2, 16, 16)
    r = 0
    for bh in range(8):
        for bw in range(8):
            for ih in range(2):
                for iw in range(2):
                    ph, pw = 2 * bh + ih, 2 * bw + iw
                    want = x[ph * 16:(ph + 1) * 16, pw * 16:(pw + 1) * 16].transpose(2, 0, 1)
                    assert np.array_equal(rows[r, :, 0], want) and np.array_equal(rows[r, :, 1], want)
                    r += 1


# ---------------------------------------------------------------------------------------------
# Bad images
# ---------------------------------------------------------------------------------------------

def _png_with_header_size(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR claims width x height (no pixel data for that size)."""
    data = bytearray(_encode(Image.new("RGB", (1, 1)), "PNG"))
    ihdr = data[8 + 8: 8 + 8 + 13]
    ihdr[0:8] = struct.pack(">II", width, height)
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + bytes(ihdr)))
    return bytes(data)


def test_pixel_limit_is_checked_from_the_header_before_decoding():
    bomb = _png_with_header_size(5000, 5000)           # 25M pixels claimed, 1 pixel of data
    with pytest.raises(ValueError, match="5000x5000 = 25000000 pixels exceeds the limit of 1000000"):
        preprocess_image(bomb, FAMILY, max_image_pixels=1_000_000)
    with pytest.raises(ValueError, match="corrupt or truncated"):      # without a limit it gets decoded
        preprocess_image(bomb, FAMILY)
    huge = _png_with_header_size(40000, 40000)         # beyond Pillow's own decompression-bomb guard
    with pytest.raises(ValueError, match="too large to decode safely"):
        preprocess_image(huge, FAMILY)
    arr = np.zeros((1200, 1000, 3), np.uint8)
    with pytest.raises(ValueError, match="exceeds the limit"):
        preprocess_image(arr, FAMILY, max_image_pixels=1_000_000)


@pytest.mark.parametrize("bad,match", [
    (b"", "image data is empty"),
    (b"definitely not an image, just some words", "not a recognised image"),
    (None, "unsupported image input type NoneType"),
    ("/etc/passwd", "unsupported image input type str"),
    (np.zeros((0, 10, 3), np.uint8), "image size 10x0 is empty"),
    (np.zeros((10, 10, 3), np.float32), "RGB uint8"),
    (np.zeros((10, 10), np.uint8), "RGB uint8"),
    (np.zeros((10, 10, 4), np.uint8), "RGB uint8"),
    (Image.new("RGB", (0, 5)), "image size 0x5 is empty"),
    (np.zeros((2, 1000, 3), np.uint8), "aspect ratio 500.0 exceeds 200"),
])
def test_bad_images_raise_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        preprocess_image(bad, FAMILY)


def test_truncated_and_unsupported_encodings():
    png = _encode(Image.fromarray(_gradient(200, 200)), "PNG")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        preprocess_image(png[: len(png) // 2], FAMILY)
    jpeg = _jpeg()
    with pytest.raises(ValueError, match="corrupt or truncated"):
        preprocess_image(jpeg[: len(jpeg) // 2], FAMILY)
    with pytest.raises(ValueError, match="not a recognised image"):
        preprocess_image(png[:12], FAMILY)
    tiff = _encode(Image.fromarray(_gradient(20, 20)), "TIFF")
    with pytest.raises(ValueError, match=r"unsupported image format TIFF \(supported: PNG, JPEG"):
        preprocess_image(tiff, FAMILY)
    with pytest.raises(ValueError, match="unsupported image format PNG"):
        preprocess_image(png, FAMILY, formats=("JPEG",))


@pytest.mark.parametrize("name", ["rgba_png", "palette_gif", "jpeg_exif_rotated", "webp", "bmp"])
def test_damaged_encodings_raise_only_value_error(name):
    """Flipped or cut bytes anywhere: either a valid image comes out or a ValueError, never another error."""
    data = ENCODED_CASES[name]()
    rng = np.random.default_rng(7)
    for trial in range(24):
        bad = bytearray(data)
        for pos in rng.integers(0, len(bad), size=1 + trial % 4):
            bad[pos] ^= int(rng.integers(1, 256))
        if trial % 3 == 0:
            bad = bad[: int(rng.integers(1, len(bad)))]
        try:
            out = preprocess_image(bytes(bad), FAMILY, max_image_pixels=4_000_000)
        except ValueError:
            continue
        assert out.pixel_values.shape[1] == 1536 and np.isfinite(out.pixel_values).all()


# ---------------------------------------------------------------------------------------------
# Videos
# ---------------------------------------------------------------------------------------------

def test_frame_sampling_matches_transformers(hf_video):
    from transformers.video_utils import VideoMetadata
    _, _, mod = hf_video
    for cfg_dict in (FAMILY_VIDEO_CONFIG, {**FAMILY_VIDEO_CONFIG, "fps": 0.5, "min_frames": 2, "max_frames": 9}):
        cfg = VisionPreprocessConfig.from_dicts(None, cfg_dict)
        fake = types.SimpleNamespace(fps=cfg.fps, min_frames=cfg.min_frames, max_frames=cfg.max_frames)
        for total in (1, 2, 3, 5, 8, 30, 61, 300, 1001, 20000):
            for fps in (1.0, 7.5, 23.976, 29.97, 30.0, 60.0, None):
                md = VideoMetadata(total_num_frames=total, fps=fps)
                want = mod.sample_frames(fake, md)
                assert np.array_equal(sample_frame_indices(total, cfg, fps), want), (total, fps)
    fixed = VisionPreprocessConfig.from_dicts(None, {**FAMILY_VIDEO_CONFIG, "fps": None, "num_frames": 6})
    fake = types.SimpleNamespace(fps=None, min_frames=4, max_frames=768)
    want = mod.sample_frames(fake, VideoMetadata(total_num_frames=50, fps=25.0), num_frames=6)
    assert np.array_equal(sample_frame_indices(50, fixed, 25.0), want)


VIDEO_CASES = {
    # name: (frames, height, width, source fps, processor overrides)
    "resized": (45, 120, 200, 15.0, {}),
    "odd_sampled_count": (7, 96, 64, 2.0, {}),             # 7 frames sampled: the last is repeated
    "thin_frames": (8, 20, 24, 4.0, {}),                   # below the factor: pre-scaled
    "no_fps_given": (50, 64, 64, None, {}),                # transformers assumes 24 fps
    "capped": (40, 360, 480, 10.0, {"cap_pixels_per_frame": True, "max_video_tokens": 32}),
    "downscaled": (12, 300, 500, 6.0, {"size": {"shortest_edge": 4096, "longest_edge": 400000}}),
}


@pytest.mark.parametrize("name", sorted(VIDEO_CASES))
def test_video_matches_transformers(hf_video, name):
    t, h, w, fps, over = VIDEO_CASES[name]
    make, processor_cls, _ = hf_video
    cfg_dict = {**FAMILY_VIDEO_CONFIG, **over}
    cfg = VisionPreprocessConfig.from_dicts(None, cfg_dict)
    frames = RNG.integers(0, 256, (t, h, w, 3), dtype=np.uint8)
    metadata = {"total_num_frames": t, **({"fps": fps} if fps is not None else {})}
    ref = make(cfg_dict)(videos=[frames], video_metadata=[metadata], return_metadata=True,
                         cap_pixels_per_frame=bool(over.get("cap_pixels_per_frame", False)))
    ours = preprocess_video(frames, cfg, fps)
    _assert_same(ours, ref["pixel_values_videos"].numpy(), ref["video_grid_thw"])
    md = ref["video_metadata"][0]
    assert ours.frame_indices == tuple(int(i) for i in md.frames_indices)
    md.fps = 24 if md.fps is None else md.fps
    want_ts = processor_cls._calculate_timestamps(None, md.frames_indices, md.fps, 2)
    assert ours.timestamps == tuple(want_ts)
    # the prompt text the processor substitutes for the template's one <|video_pad|>
    fake = types.SimpleNamespace(video_processor=types.SimpleNamespace(merge_size=2, temporal_patch_size=2),
                                 vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
                                 video_token="<|video_pad|>")
    fake._calculate_timestamps = lambda *a: processor_cls._calculate_timestamps(fake, *a)
    inputs = {"video_grid_thw": ref["video_grid_thw"], "video_metadata": [md]}
    assert video_placeholder_text(ours, 2) == processor_cls.replace_video_token(fake, inputs, 0)
    # pre-sampled frames give the same result
    again = preprocess_video(frames[list(ours.frame_indices)], cfg, fps, frame_indices=ours.frame_indices)
    assert np.array_equal(again.pixel_values, ours.pixel_values) and again.timestamps == ours.timestamps
    assert again.digest() == ours.digest()


def test_video_prompt_structure():
    frames = RNG.integers(0, 256, (20, 64, 96, 3), dtype=np.uint8)
    vid = preprocess_video(frames, FAMILY, fps=4.0)       # 5 s at 2 fps: 10 frames, 5 groups
    assert vid.frame_indices == (0, 2, 4, 6, 8, 11, 13, 15, 17, 19)
    assert vid.grid_thw == (5, 4, 6) and vid.num_tokens(2) == 30
    groups = video_groups(vid, 2)
    assert [g.text for g in groups] == ["<0.2 seconds>", "<1.2 seconds>", "<2.4 seconds>", "<3.5 seconds>",
                                        "<4.5 seconds>"]
    assert all(g.num_pad_tokens == 6 for g in groups)
    text = video_placeholder_text(vid, 2)
    assert text.startswith("<0.2 seconds><|vision_start|>" + "<|video_pad|>" * 6 + "<|vision_end|><1.2 seconds>")
    assert text.count("<|video_pad|>") == 30 and text.count("<|vision_start|>") == 5


def test_bad_videos_raise_value_error():
    ok = np.zeros((4, 64, 64, 3), np.uint8)
    with pytest.raises(ValueError, match=r"RGB uint8 array \[T, H, W, 3\]"):
        preprocess_video(ok[..., :1], FAMILY, 30.0)
    with pytest.raises(ValueError, match=r"RGB uint8 array"):
        preprocess_video(ok.astype(np.float32), FAMILY, 30.0)
    with pytest.raises(ValueError, match="no frames"):
        preprocess_video(ok[:0], FAMILY, 30.0)
    with pytest.raises(ValueError, match="at least 2 sampled frames"):
        preprocess_video(ok[:1], FAMILY, 30.0)
    with pytest.raises(ValueError, match="fps must be a positive number"):
        preprocess_video(ok, FAMILY, -1.0)
    with pytest.raises(ValueError, match="exceeds the limit"):
        preprocess_video(ok, FAMILY, 30.0, max_frame_pixels=1000)
    with pytest.raises(ValueError, match="frame_indices has 3 entries for 4 frames"):
        preprocess_video(ok, FAMILY, 30.0, frame_indices=[0, 1, 2])


def test_timestamps_pad_like_the_processor():
    assert frame_timestamps([0, 10, 20], 10.0, 2) == (0.5, 2.0)


# ---------------------------------------------------------------------------------------------
# Placeholders and config
# ---------------------------------------------------------------------------------------------

def test_placeholder_counts():
    assert num_placeholder_tokens((1, 14, 20), 2) == 70
    assert num_placeholder_tokens((3, 8, 12), 2) == 72
    img = preprocess_image(np.zeros((100, 150, 3), np.uint8), FAMILY)
    assert img.grid_thw == (1, 14, 20) and image_placeholder_text(img, 2) == "<|image_pad|>" * 70
    with pytest.raises(ValueError, match="divisible by merge_size"):
        num_placeholder_tokens((1, 3, 4), 2)


def test_config_defaults_and_transformers_key_semantics():
    assert VisionPreprocessConfig.from_dicts(None, None) == FAMILY == VisionPreprocessConfig()
    assert VisionPreprocessConfig.from_resources({}) == FAMILY
    res = {"preprocessor_config.json": json.dumps(FAMILY_IMAGE_CONFIG).encode(),
           "video_preprocessor_config.json": json.dumps({**FAMILY_VIDEO_CONFIG, "fps": 1}).encode()}
    cfg = VisionPreprocessConfig.from_resources(res)
    assert cfg.fps == 1.0 and cfg.max_pixels == 16777216 and cfg.video_min_pixels == 4096
    legacy = VisionPreprocessConfig.from_dicts({**FAMILY_IMAGE_CONFIG, "min_pixels": 1024, "max_pixels": 9999}, None)
    assert (legacy.min_pixels, legacy.max_pixels) == (1024, 9999)
    # a present file that omits a key takes transformers' class default (Qwen2-VL's patch 14)
    with pytest.raises(ValueError, match=r"patch_size differs .* \(14\) .* \(16\)"):
        VisionPreprocessConfig.from_dicts({"size": {"shortest_edge": 1, "longest_edge": 2}}, None)
    with pytest.raises(ValueError, match="does not match the vision tower"):
        FAMILY.check_tower(patch_size=14, temporal_patch_size=2, spatial_merge_size=2)
    FAMILY.check_tower(patch_size=16, temporal_patch_size=2, spatial_merge_size=2)


@pytest.mark.parametrize("image_cfg,video_cfg,match", [
    ({**FAMILY_IMAGE_CONFIG, "do_normalize": False}, None, "do_normalize=False is not supported"),
    ({**FAMILY_IMAGE_CONFIG, "resample": 2}, None, "resample=2 is not supported"),
    ({**FAMILY_IMAGE_CONFIG, "image_mean": [0.5, 0.5]}, None, "image_mean must be 3 numbers"),
    ({**FAMILY_IMAGE_CONFIG, "size": {"shortest_edge": 100}}, None, "must hold 'shortest_edge' and 'longest_edge'"),
    ({**FAMILY_IMAGE_CONFIG, "size": {"shortest_edge": 100, "longest_edge": 10}}, None, "exceeds size.longest_edge"),
    (None, {**FAMILY_VIDEO_CONFIG, "num_frames": 8}, "num_frames and fps are mutually exclusive"),
    (None, {**FAMILY_VIDEO_CONFIG, "fps": -2}, "fps must be a positive number"),
    (None, {**FAMILY_VIDEO_CONFIG, "min_frames": 10, "max_frames": 4}, "min_frames .* exceeds max_frames"),
    ([1, 2], None, "must be a JSON object"),
])
def test_bad_configs_raise_value_error(image_cfg, video_cfg, match):
    with pytest.raises(ValueError, match=match):
        VisionPreprocessConfig.from_dicts(image_cfg, video_cfg)
    with pytest.raises(ValueError, match="not valid JSON"):
        VisionPreprocessConfig.from_resources({"preprocessor_config.json": b"{nope"})


# ---------------------------------------------------------------------------------------------
# Converter: the configs travel in the artifact
# ---------------------------------------------------------------------------------------------

def test_converter_stores_preprocessor_configs(tiny_checkpoint_dir, tmp_path):
    from ninfer.artifact import open_artifact
    from ninfer.convert import ConvertError, convert, frontend_resources

    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint_dir("dense", "official"), src)
    assert "preprocessor_config.json" not in frontend_resources(src)
    image_cfg = {**FAMILY_IMAGE_CONFIG, "size": {"shortest_edge": 1024, "longest_edge": 200000},
                 "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}
    (src / "preprocessor_config.json").write_text(json.dumps(image_cfg))
    (src / "video_preprocessor_config.json").write_text(json.dumps({**FAMILY_VIDEO_CONFIG, "fps": 1}))
    out = convert(src, tmp_path / "m.ninfer")
    with open_artifact(out, verify=True) as art:
        res = art.frontend_resources()
        for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
            assert res[name] == (src / name).read_bytes()
        cfg = VisionPreprocessConfig.from_resources(res)
        assert (cfg.min_pixels, cfg.max_pixels, cfg.fps) == (1024, 200000, 1.0)
        provenance = {f["name"] for f in art.descriptor["source"]["files"]}
        assert {"preprocessor_config.json", "video_preprocessor_config.json"} <= provenance
    (src / "video_preprocessor_config.json").write_text(json.dumps({**FAMILY_VIDEO_CONFIG, "patch_size": 14}))
    with pytest.raises(ConvertError, match="patch_size differs"):
        convert(src, tmp_path / "bad.ninfer")


def test_artifact_without_configs_uses_family_values(tiny_artifact_path):
    from ninfer.artifact import open_artifact
    with open_artifact(tiny_artifact_path("dense")) as art:
        res = art.frontend_resources()
    assert "preprocessor_config.json" not in res
    assert VisionPreprocessConfig.from_resources(res) == FAMILY


def test_media_digests_follow_the_tower_input():
    """The digest (the prefix cache's media identity) comes from the uint8 patch values and the normalisation
    table the rows are made of: equal for the same pixels however given, different for one changed pixel or
    another normalisation."""
    img = RNG.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(img).save(png, format="PNG")
    ours = preprocess_image(img, FAMILY)
    assert ours.digest() == ImageInput(rows=ours.rows, grid_thw=ours.grid_thw).digest()    # the rows alone
    assert {preprocess_image(x, FAMILY).digest() for x in (png.getvalue(), Image.fromarray(img))} == {ours.digest()}
    rows_only = ImageInput(rows=ours.rows, grid_thw=ours.grid_thw)
    copied = PatchRows(ours.rows.values.copy(), ours.rows.table.copy(), ours.rows.repeat)
    assert rows_only.digest() == ImageInput(rows=copied, grid_thw=ours.grid_thw).digest()
    touched = img.copy()
    touched[50, 60, 1] ^= 1
    assert preprocess_image(touched, FAMILY).digest() != ours.digest()
    other = VisionPreprocessConfig.from_dicts({**FAMILY_IMAGE_CONFIG, "image_mean": [0.4, 0.5, 0.5]},
                                              FAMILY_VIDEO_CONFIG)
    assert preprocess_image(img, other).digest() != ours.digest()
    frames = RNG.integers(0, 256, (8, 64, 96, 3), dtype=np.uint8)
    video = preprocess_video(frames, FAMILY, 4.0)
    changed = frames.copy()
    changed[video.frame_indices[-1], 3, 3, 0] ^= 1
    assert preprocess_video(frames, FAMILY, 4.0).digest() == video.digest()
    assert preprocess_video(changed, FAMILY, 4.0).digest() != video.digest()

