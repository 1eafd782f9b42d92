"""PatchRows, the vision tower's input as the Frontend hands it over (uint8 patch values + a lookup table): the
host's float32 rows are transformers' (tests/unit/frontend/test_vision_preprocess.py), and the Program's device
lookup gives the same numbers bit for bit, in float32 and cast to bf16, across its row chunks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.targets.qwen3_6.frontend.video_preprocess import preprocess_video
from ninfer.targets.qwen3_6.frontend.vision_preprocess import (FAMILY_IMAGE_CONFIG, FAMILY_VIDEO_CONFIG,
                                                                VisionPreprocessConfig, preprocess_image)
from ninfer.targets.qwen3_6.patch_rows import PatchRows
from ninfer.targets.qwen3_6.program import vision

CFG = VisionPreprocessConfig.from_dicts(FAMILY_IMAGE_CONFIG, FAMILY_VIDEO_CONFIG)
RNG = np.random.default_rng(7)


def _media():
    image = preprocess_image(RNG.integers(0, 256, (96, 160, 3), dtype=np.uint8), CFG)
    video = preprocess_video(RNG.integers(0, 256, (5, 64, 96, 3), dtype=np.uint8), CFG, 2.0)   # padded to 6
    return image, video


def test_rows_shapes_and_slices():
    image, video = _media()
    assert image.rows.repeat == CFG.temporal_patch_size and image.rows.values.shape[2] == 1
    assert video.rows.repeat == 1 and video.rows.values.shape[2] == CFG.temporal_patch_size
    for x in (image, video):
        rows = x.rows
        assert rows.shape == x.pixel_values.shape == (len(rows), CFG.patch_dim)
        assert np.array_equal(rows[3:11].float32(), x.pixel_values[3:11])
    # an image's rows hold its frame twice along the temporal axis
    per = image.pixel_values.reshape(len(image.rows), 3, CFG.temporal_patch_size, -1)
    assert np.array_equal(per[:, :, 0], per[:, :, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_lookup_equals_the_host_rows(monkeypatch, dtype):
    image, video = _media()
    for x in (image, video):
        want = torch.from_numpy(x.pixel_values).to(dtype)
        assert torch.equal(vision.patch_rows_tensor(x.rows, "cpu", dtype), want)
        monkeypatch.setattr(vision, "_LOOKUP_ROWS", 7)            # several chunks, a ragged last one
        assert torch.equal(vision.patch_rows_tensor(x.rows, "cpu", dtype), want)
        monkeypatch.undo()


def test_bad_rows_are_refused():
    values = np.zeros((4, 3, 1, 4), np.uint8)
    table = np.zeros((3, 256), np.float32)
    with pytest.raises(ValueError, match="uint8"):
        PatchRows(values.astype(np.int16), table)
    with pytest.raises(ValueError, match=r"float32 \[3, 256\]"):
        PatchRows(values, table[:2])
    with pytest.raises(ValueError, match="repeat"):
        PatchRows(values, table, 0)
    with pytest.raises(TypeError, match="row ranges"):
        PatchRows(values, table)[0]
