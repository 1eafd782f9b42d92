"""MRoPE positions of mixed text/image/video prompts (frontend/mrope.py) against transformers 5.24.

The oracle is `Qwen3_5Model.get_rope_index` (and the MoE model's) called on a config-only stand-in
for the model (the method reads only `config.vision_config.spatial_merge_size` and its own position
helper). Prompts are built as `Qwen3VLProcessor` builds them: the official chat template, then
transformers' own placeholder expansion (`replace_image_token`, `replace_video_token` with the
per-group timestamps, `get_text_with_replacements`), our tokenizer, and `create_mm_token_type_ids`.
"""
from __future__ import annotations

import functools
import importlib.util
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
# NOTE: transformers is imported by the first test that needs it (_hf), not at collection: its Qwen3-VL
# processor module takes seconds to import, and every pytest-xdist worker collects this file.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="could not import 'transformers'")

from ninfer.targets.qwen3_6.frontend import vocab  # noqa: E402
from ninfer.targets.qwen3_6.frontend.chat_template import ChatTemplate  # noqa: E402
from ninfer.targets.qwen3_6.frontend.frontend import IMAGE_PAD_ID, VIDEO_PAD_ID  # noqa: E402
from ninfer.targets.qwen3_6.frontend.mrope import (MediaGrid, decode_rope_position,  # noqa: E402
                                                   rope_positions)
from ninfer.targets.qwen3_6.frontend.tokenizer import Qwen36Tokenizer  # noqa: E402
from ninfer.targets.registry import lookup  # noqa: E402
from ninfer.testing.tiny_hf import KINDS, hf_vision_config_kwargs  # noqa: E402

VISION_START, VISION_END = 248053, 248054
TIMESTAMP_END = 29        # ">", the last token of a "<T seconds>" timestamp
MERGE = 2


# ---------------------------------------------------------------------------------------------
# transformers: the oracle and the processor's prompt construction

@functools.cache
def _hf() -> types.SimpleNamespace:
    """transformers and the processor pieces the oracle uses, imported once."""
    import transformers as tf
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin
    from transformers.video_utils import VideoMetadata
    return types.SimpleNamespace(tf=tf, Qwen3VLProcessor=Qwen3VLProcessor, ProcessorMixin=ProcessorMixin,
                                 VideoMetadata=VideoMetadata)


@functools.cache
def _hf_model_stand_in(kind: str):
    tf = _hf().tf
    d = lookup(KINDS[kind]).dims
    cfg_cls, model_cls = ((tf.Qwen3_5MoeConfig, tf.Qwen3_5MoeModel) if d.is_moe
                          else (tf.Qwen3_5Config, tf.Qwen3_5Model))
    cfg = cfg_cls(vision_config=hf_vision_config_kwargs(d))
    assert cfg.vision_config.spatial_merge_size == MERGE
    me = types.SimpleNamespace(config=cfg)
    me.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, me)
    return me, model_cls


def _hf_processor_stand_in():
    me = types.SimpleNamespace(
        image_token="<|image_pad|>", video_token="<|video_pad|>", vision_start_token="<|vision_start|>",
        vision_end_token="<|vision_end|>", image_token_ids=[IMAGE_PAD_ID], video_token_ids=[VIDEO_PAD_ID],
        audio_token_ids=[], all_special_multimodal_tokens=["<|image_pad|>", "<|video_pad|>"],
        image_processor=types.SimpleNamespace(merge_size=MERGE),
        video_processor=types.SimpleNamespace(merge_size=MERGE, temporal_patch_size=2))
    me._calculate_timestamps = types.MethodType(_hf().Qwen3VLProcessor._calculate_timestamps, me)
    return me


def hf_rope_index(ids, image_grids=(), video_grids=(), kind: str = "dense"):
    """transformers' positions [3, L] and delta for one unpadded prompt."""
    me, model_cls = _hf_model_stand_in(kind)
    mm = _hf().ProcessorMixin.create_mm_token_type_ids(_hf_processor_stand_in(), [list(ids)])
    pos, delta = model_cls.get_rope_index(
        me, torch.tensor([list(ids)], dtype=torch.long), mm_token_type_ids=torch.tensor(mm),
        image_grid_thw=torch.tensor(image_grids, dtype=torch.long).reshape(-1, 3) if image_grids else None,
        video_grid_thw=torch.tensor(video_grids, dtype=torch.long).reshape(-1, 3) if video_grids else None)
    return pos[:, 0].numpy(), int(delta.reshape(-1)[0])


@functools.cache
def _tokenizer() -> Qwen36Tokenizer:
    return Qwen36Tokenizer(vocab.tokenizer_json_bytes())


@functools.cache
def _template() -> ChatTemplate:
    return ChatTemplate(vocab.chat_template())


def processor_prompt(messages, images=(), videos=()):
    """Token ids as Qwen3VLProcessor builds them. images: grids (1, h, w); videos: (grid, fps,
    frames_indices) with 2 * grid t sampled frame indices."""
    proc, hf = _hf_processor_stand_in(), _hf()
    text = _template().render(messages, add_generation_prompt=True)
    image_inputs = {"image_grid_thw": np.array(images, dtype=np.int64).reshape(-1, 3)}
    video_inputs = {"video_grid_thw": np.array([g for g, _, _ in videos], dtype=np.int64).reshape(-1, 3),
                    "video_metadata": [hf.VideoMetadata(total_num_frames=idx[-1] + 1, fps=fps, frames_indices=list(idx))
                                       for _, fps, idx in videos]}
    image_repl = [hf.Qwen3VLProcessor.replace_image_token(proc, image_inputs, i) for i in range(len(images))]
    video_repl = [hf.Qwen3VLProcessor.replace_video_token(proc, video_inputs, i) for i in range(len(videos))]
    (text,), _ = hf.ProcessorMixin.get_text_with_replacements(proc, [text], image_repl, video_repl)
    return _tokenizer().encode(text), text


def user(*parts):
    content = []
    for p in parts:
        content.append({"type": "text", "text": p} if isinstance(p, str) else {"type": p[0]})
    return {"role": "user", "content": content}


def assert_parity(ids, images=(), videos=(), kind="dense"):
    """Ours equals transformers' for the prompt, with videos given whole and split per group."""
    media = [MediaGrid("image", tuple(g)) if tag == "image" else MediaGrid("video", tuple(g))
             for tag, g in _media_order(ids, images, videos)]
    ref_pos, ref_delta = hf_rope_index(ids, images, videos, kind)
    pos, delta = rope_positions(ids, media, spatial_merge_size=MERGE)
    assert pos.dtype == np.int64 and pos.shape == (3, len(ids))
    np.testing.assert_array_equal(pos, ref_pos)
    assert delta == ref_delta
    per_group = [g for m in media for g in ([MediaGrid("video", (1,) + m.grid_thw[1:])] * m.grid_thw[0]
                                            if m.kind == "video" else [m])]
    pos2, delta2 = rope_positions(ids, per_group, spatial_merge_size=MERGE)
    np.testing.assert_array_equal(pos2, ref_pos)
    assert delta2 == ref_delta
    return pos, delta


def _media_order(ids, images, videos):
    """(kind, grid) of each image and video in the order their first runs appear in ids."""
    images, videos, out = list(images), list(videos), []
    ids = np.asarray(ids)
    prev = np.concatenate(([-1], ids[:-1]))
    run_starts = np.flatnonzero(np.isin(ids, [IMAGE_PAD_ID, VIDEO_PAD_ID]) & (prev != ids))
    pending_video_runs = 0
    for s in run_starts:
        if ids[s] == IMAGE_PAD_ID:
            out.append(("image", images.pop(0)))
        elif pending_video_runs:
            pending_video_runs -= 1
        else:
            g = videos.pop(0)
            out.append(("video", g))
            pending_video_runs = g[0] - 1
    assert not images and not videos
    return out


def video(t, h, w, fps=24.0, step=12):
    """A video grid (t, h, w) sampled every `step` source frames (2 frames per temporal group)."""
    return (t, h, w), fps, [step * i for i in range(2 * t)]


# ---------------------------------------------------------------------------------------------
# parity with transformers

@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_text_only(kind):
    ids, _ = processor_prompt([user("Hello there, how are you?")])
    pos, delta = assert_parity(ids, kind=kind)
    np.testing.assert_array_equal(pos, np.tile(np.arange(len(ids)), (3, 1)))
    assert delta == 0
    assert rope_positions([7], spatial_merge_size=MERGE).positions.tolist() == [[0], [0], [0]]


def test_one_image_matches_the_documented_example():
    # qwen3_6.md 7.4: grid 1x14x20 after `<|im_start|>user\n<|vision_start|>`: t = 4, h = 4..10,
    # w = 4..13, `<|vision_end|>` at 14, rope_delta = -60.
    ids, _ = processor_prompt([user(("image",), "What is this?")], images=[(1, 14, 20)])
    pos, delta = assert_parity(ids, images=[(1, 14, 20)])
    first = ids.index(IMAGE_PAD_ID)
    assert first == 4 and ids[first + 70] == VISION_END
    img = pos[:, first:first + 70]
    assert set(img[0].tolist()) == {4}
    assert (img[1].min(), img[1].max(), img[2].min(), img[2].max()) == (4, 10, 4, 13)
    assert pos[:, first + 70].tolist() == [14, 14, 14]
    assert delta == -60


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_two_images_of_different_sizes_with_text_between(kind):
    grids = [(1, 8, 12), (1, 20, 6)]
    ids, _ = processor_prompt([user(("image",), "compare this one with", ("image",), "which is larger?")],
                              images=grids)
    assert ids.count(IMAGE_PAD_ID) == 24 + 30
    assert_parity(ids, images=grids, kind=kind)


def test_image_at_the_very_start():
    grid = (1, 6, 10)
    ids = [IMAGE_PAD_ID] * 15 + [VISION_END, 3838, 374, 419, 30]
    pos, delta = assert_parity(ids, images=[grid])
    assert pos[:, 0].tolist() == [0, 0, 0] and pos[:, 14].tolist() == [0, 2, 4]
    assert pos[:, 15].tolist() == [5, 5, 5] and delta == 5 + 5 - len(ids)
    # a prompt that is only an image
    pos, delta = assert_parity([IMAGE_PAD_ID] * 15, images=[grid])
    assert delta == 5 - 15
    # runs of different kinds side by side are separate runs (the model's token-type grouping)
    ids = [IMAGE_PAD_ID] * 15 + [VIDEO_PAD_ID] * 6 + [TIMESTAMP_END, VISION_START] + [VIDEO_PAD_ID] * 6 + [1]
    assert_parity(ids, images=[grid], videos=[(2, 4, 6)])


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_video_with_several_temporal_groups(kind):
    v = video(4, 8, 12)
    ids, text = processor_prompt([user(("video",), "Describe the video.")], videos=[v])
    # the processor's per-group layout: <T seconds><|vision_start|> pads <|vision_end|>, T = mean of the 2 frames
    assert "<0.2 seconds><|vision_start|>" in text and "<1.2 seconds><|vision_start|>" in text
    assert text.count("<|vision_start|>") == 1 + 4
    pos, delta = assert_parity(ids, videos=[v[0]], kind=kind)
    starts = [i for i in range(len(ids)) if ids[i] == VIDEO_PAD_ID and ids[i - 1] != VIDEO_PAD_ID]
    assert len(starts) == 4
    for s in starts:                      # each group: one temporal position, its own 4x6 merged grid
        grp = pos[:, s:s + 24]
        assert len(set(grp[0].tolist())) == 1
        assert grp[1].max() - grp[1].min() == 3 and grp[2].max() - grp[2].min() == 5


def test_videos_sampled_at_other_rates_and_odd_frame_counts():
    for v in (video(3, 4, 4, fps=30.0, step=15), video(1, 16, 8, fps=2.0, step=1), video(6, 2, 2, fps=10, step=3)):
        ids, _ = processor_prompt([user("before", ("video",), "after")], videos=[v])
        assert_parity(ids, videos=[v[0]])


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_images_and_videos_mixed(kind):
    images = [(1, 10, 14), (1, 4, 4)]
    videos = [video(3, 6, 8), video(2, 12, 4, fps=30, step=15)]
    msgs = [{"role": "system", "content": "You are a careful observer."},
            user(("image",), "then a clip", ("video",)),
            {"role": "assistant", "content": "I see a cat and a clip of a dog."},
            user(("video",), "and", ("image",), "What changed?")]
    ids, _ = processor_prompt(msgs, images=images, videos=videos)
    assert_parity(ids, images=images, videos=[v[0] for v in videos], kind=kind)


def test_random_prompts_against_transformers():
    rng = np.random.default_rng(49)
    for _ in range(60):
        ids, images, videos = [], [], []
        for _ in range(int(rng.integers(0, 5))):
            ids += rng.integers(0, 248000, int(rng.integers(0, 6))).tolist()
            if rng.random() < 0.6:
                g = (1, 2 * int(rng.integers(1, 9)), 2 * int(rng.integers(1, 9)))
                images.append(g)
                ids += [VISION_START] + [IMAGE_PAD_ID] * (g[1] * g[2] // 4) + [VISION_END]
            else:
                g = (int(rng.integers(1, 5)), 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 6)))
                videos.append(g)
                ids.append(VISION_START)
                for _ in range(g[0]):
                    ids += rng.integers(0, 248000, int(rng.integers(1, 5))).tolist()
                    ids += [VISION_START] + [VIDEO_PAD_ID] * (g[1] * g[2] // 4) + [VISION_END]
                ids.append(VISION_END)
        ids += rng.integers(0, 248000, int(rng.integers(1, 6))).tolist()
        assert_parity(ids, images=images, videos=videos)


# ---------------------------------------------------------------------------------------------
# prefixes (staged prefill, prefix reuse) and decoding

def _mixed_prompt():
    images, videos = [(1, 6, 8), (1, 4, 10)], [video(3, 4, 6)]
    ids, _ = processor_prompt([user(("image",), "x", ("video",), "y", ("image",), "z?")],
                              images=images, videos=videos)
    media = [MediaGrid("image", images[0]), MediaGrid("video", videos[0][0]), MediaGrid("image", images[1])]
    return ids, media


def test_every_prefix_is_the_slice_of_the_whole_prompt():
    ids, media = _mixed_prompt()
    whole, delta = rope_positions(ids, media, spatial_merge_size=MERGE)
    for k in range(1, len(ids) + 1):
        part, _ = rope_positions(ids[:k], media, spatial_merge_size=MERGE, complete=False)
        np.testing.assert_array_equal(part, whole[:, :k], err_msg=f"split at {k}")
    assert rope_positions(ids, media, spatial_merge_size=MERGE, complete=False).rope_delta == delta
    # stages: any cut points, concatenated, give the whole
    cuts = [0, 7, ids.index(VIDEO_PAD_ID) + 3, len(ids) - 2, len(ids)]
    stages = [rope_positions(ids[:b], media, spatial_merge_size=MERGE, complete=False).positions[:, a:b]
              for a, b in zip(cuts, cuts[1:])]
    np.testing.assert_array_equal(np.concatenate(stages, axis=1), whole)


def test_decoding_continues_the_positions_of_a_re_fed_output():
    ids, media = _mixed_prompt()
    pos, delta = rope_positions(ids, media, spatial_merge_size=MERGE)
    assert delta < 0
    assert decode_rope_position(len(ids), delta) == int(pos.max()) + 1
    generated = [9707, 11, 1879, 0, 248046]
    longer, delta2 = rope_positions(ids + generated, media, spatial_merge_size=MERGE)
    assert delta2 == delta
    for i in range(len(generated)):
        n = len(ids) + i
        assert longer[:, n].tolist() == [decode_rope_position(n, delta)] * 3
    # transformers' decode step: cache_length + arange + rope_deltas on all three axes
    ref_pos, ref_delta = hf_rope_index(ids + generated, [m.grid_thw for m in media if m.kind == "image"],
                                       [m.grid_thw for m in media if m.kind == "video"])
    np.testing.assert_array_equal(longer, ref_pos)
    assert decode_rope_position(0, 0) == 0


# ---------------------------------------------------------------------------------------------
# bad input

@pytest.mark.parametrize("ids, media, complete, match", [
    ([1, 2, 3], [("image", (1, 2, 2))], True, r"media\[0\] \(image\) has no placeholder run"),
    ([1, IMAGE_PAD_ID, 2], [], True, r"image placeholder run at token 1 \(1 tokens\) has no media entry"),
    ([1, IMAGE_PAD_ID, 2], [("video", (1, 2, 2))], True, r"run at token 1 is image but media\[0\] is video"),
    ([1, IMAGE_PAD_ID, IMAGE_PAD_ID], [("image", (1, 2, 2))], True, r"has 2 tokens but media\[0\] needs 1"),
    ([1, IMAGE_PAD_ID, IMAGE_PAD_ID], [("image", (1, 2, 2))], False, r"has 2 tokens but media\[0\] needs 1"),
    ([1, IMAGE_PAD_ID, 2], [("image", (1, 4, 2))], False, r"has 1 tokens but media\[0\] needs 2"),
    ([1, VIDEO_PAD_ID, 2], [("video", (2, 2, 2))], True,
     r"media\[0\] \(video, temporal group 2 of 2\) has no placeholder run in token_ids \(1 of the 2"),
    ([1, IMAGE_PAD_ID], [("image", (1, 3, 2))], True, r"multiples of the spatial merge size 2"),
    ([1, IMAGE_PAD_ID], [("audio", (1, 2, 2))], True, r"kind must be 'image' or 'video'"),
    ([1, IMAGE_PAD_ID], [("image", (1, 2))], True, r"grid_thw must be three positive integers"),
    ([1, IMAGE_PAD_ID], [("image", (0, 2, 2))], True, r"grid_thw must be three positive integers"),
    ([1, IMAGE_PAD_ID], [("image", (1.0, 2, 2))], True, r"grid_thw must be three positive integers"),
    ([1, IMAGE_PAD_ID], ["image"], True, r"media\[0\] must be a MediaGrid"),
    ([], [], True, r"token_ids is empty"),
    ([[1, 2]], [], True, r"1-D sequence of integers"),
    ([1.5, 2.0], [], True, r"1-D sequence of integers"),
])
def test_bad_input_is_named(ids, media, complete, match):
    with pytest.raises(ValueError, match=match):
        rope_positions(ids, media, spatial_merge_size=MERGE, complete=complete)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="spatial_merge_size"):
        rope_positions([1], spatial_merge_size=0)
    with pytest.raises(ValueError, match="kv_position"):
        decode_rope_position(-1, 0)
    with pytest.raises(ValueError, match="kv_position"):
        decode_rope_position(1.5, 0)
    with pytest.raises(ValueError, match="rope_delta"):
        decode_rope_position(3, 0.5)
