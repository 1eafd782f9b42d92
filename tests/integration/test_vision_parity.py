"""Vision parity with transformers (tiny VL checkpoints, fp32 on the CPU): a chat prompt with two images of
different sizes, text between them and one video goes through the Frontend (preprocessing, placeholder
expansion, MRoPE positions) and the Program (the vision tower's rows in place of the placeholders); the logits
at every prompt position equal `Qwen3_5ForConditionalGeneration`'s on the same pixels, and greedy tokens equal
for 64 tokens through the public Engine."""
from __future__ import annotations

import functools
import io

import numpy as np
import pytest
import torch

from ninfer import EngineConfig
from ninfer.contract.frontend import OutputOptions
from ninfer.contract.program import MediaInput, SamplingParams, SequenceRequest
from ninfer.engine.facade import Engine
from ninfer.testing.tiny_hf import build_hf_model
from support.numerics import rel_rms
from support.program_util import tiny_parts

GREEDY = SamplingParams(temperature=0.0)
_hf = functools.lru_cache(maxsize=None)(build_hf_model)        # one transformers model per kind for the module


def _png(h, w, seed):
    from PIL import Image
    a = (np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _messages():
    frames = (np.random.default_rng(3).random((8, 40, 56, 3)) * 255).astype(np.uint8)
    return [{"role": "user", "content": [
        {"type": "image", "image": _png(64, 96, 1)}, {"type": "text", "text": "and then"},
        {"type": "image", "image": _png(120, 40, 2)}, {"type": "text", "text": "and a clip"},
        {"type": "video", "video": frames}, {"type": "text", "text": "What changed?"}]}]


def _hf_inputs(prompt):
    img = [m for m in prompt.media if m.kind == "image"]
    vid = [m for m in prompt.media if m.kind == "video"]
    ids = torch.tensor([prompt.token_ids])
    kw = dict(input_ids=ids, mm_token_type_ids=(ids == 248056).long() + 2 * (ids == 248057).long())
    if img:
        kw.update(pixel_values=torch.cat([torch.as_tensor(m.pixel_values.float32()) for m in img]),
                  image_grid_thw=torch.tensor([m.grid_thw for m in img]))
    if vid:
        # NOTE: transformers takes the whole video as one entry of grid (T, h, w); the Frontend keeps one input
        #       per temporal group (the tower attends within each frame group either way).
        t = len(vid)
        kw.update(pixel_values_videos=torch.cat([torch.as_tensor(m.pixel_values.float32()) for m in vid]),
                  video_grid_thw=torch.tensor([[t, vid[0].grid_thw[1], vid[0].grid_thw[2]]]))
    return kw


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_mixed_prompt_logits_equal_transformers(tiny_artifact_path, kind):
    frontend, make_program = tiny_parts(tiny_artifact_path, kind, page_size=16, num_pages=64, num_slots=2,
                                        max_model_len=512, max_batch=2)
    prompt = frontend.prepare_chat(_messages())
    assert [m.kind for m in prompt.media].count("image") == 2 and len(prompt.media) > 3
    hf = _hf(kind, "vl")
    with torch.no_grad():
        want = hf(**_hf_inputs(prompt)).logits[0].float()
    prog = make_program()
    req = SequenceRequest(prompt.token_ids, 4, GREEDY, media=tuple(
        MediaInput(m.kind, m.offset, m.length, m.content_digest, m.pixel_values, m.grid_thw) for m in prompt.media),
        rope_positions=prompt.rope_positions, rope_delta=prompt.rope_delta)
    s = prog.start_materialize(prog.plan_materialize(req)).sequence
    P = len(prompt.token_ids)
    got = []
    for size in (37, 70, P - 107):                   # stages that split an image and the video
        step, lg = prog.prefill_with_logits(s, size)
        got.append(lg)
    got = torch.cat(got)
    assert got.shape == want.shape
    assert rel_rms(got, want) < 1e-5
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    prog.commit(step.pending, [1])
    prog.release(s)


def test_greedy_through_the_engine_equals_transformers(tiny_artifact_path):
    frontend, make_program = tiny_parts(tiny_artifact_path, "dense", page_size=16, num_pages=64, num_slots=4,
                                        max_model_len=512, max_batch=2)
    prompt = frontend.prepare_chat(_messages())
    hf = _hf("dense", "vl")
    with torch.no_grad():
        out = hf.generate(**_hf_inputs(prompt), max_new_tokens=64, do_sample=False)
    want = out[0, len(prompt.token_ids):].tolist()
    with Engine.from_program(make_program(), frontend, EngineConfig(max_model_len=512, prefill_chunk_tokens=64)) as eng:
        assert eng.wait_ready(30).ready
        r = eng.submit(prompt, GREEDY, max_tokens=64, output=OutputOptions(ignore_eos=True)).result()
    assert list(r.token_ids) == want


def _chat_turns(frontend, eng, image):
    first = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "What is it?"}]}]
    kw = dict(chat_template_kwargs={"enable_thinking": False})
    r1 = eng.submit(frontend.prepare_chat(first, **kw), GREEDY, max_tokens=6,
                    output=OutputOptions(ignore_eos=True)).result()
    second = first + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "And the colour?"}]
    r2 = eng.submit(frontend.prepare_chat(second, **kw), GREEDY, max_tokens=6,
                    output=OutputOptions(ignore_eos=True)).result()
    return list(r1.token_ids), list(r2.token_ids), r1.usage.num_reused_tokens, r2.usage.num_reused_tokens


def test_a_chat_with_an_image_reuses_the_cache_and_equals_a_cache_off_run(tiny_artifact_path):
    frontend, make_program = tiny_parts(tiny_artifact_path, "dense", page_size=16, num_pages=96, num_slots=8,
                                        max_model_len=512, max_batch=2)
    a, b = _png(64, 96, 1), _png(64, 96, 5)              # same size, different pixels: the same placeholders
    runs = {}
    for cache in (False, True):
        cfg = EngineConfig(max_model_len=512, prefill_chunk_tokens=64, prefix_cache=cache)
        with Engine.from_program(make_program(), frontend, cfg) as eng:
            assert eng.wait_ready(30).ready
            runs[cache] = _chat_turns(frontend, eng, a)
            other = _chat_turns(frontend, eng, b)
    assert runs[True][:2] == runs[False][:2]
    assert runs[True][3] > 70 and runs[False][3] == 0    # turn two reused turn one's image and answer
    # NOTE: another image reuses at most the tokens before its placeholders (<|im_start|>user\n<|vision_start|>),
    #       never the first image's rows; its own second turn reuses its first
    assert other[2] <= 4 and other[3] > 70
