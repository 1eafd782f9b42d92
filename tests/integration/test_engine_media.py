"""A prompt with media through the public Engine (tiny dense, fp32 on the CPU, a stand-in vision encoder): the
Engine hands the media, the MRoPE positions and the rope delta to the Program, and the output equals the
Program's own, also when it reuses the checkpoint of the same prompt; a Program without vision refuses it."""
from __future__ import annotations

import pytest

from ninfer import EngineConfig
from ninfer.contract.frontend import MediaPlaceholder, OutputOptions, PreparedPrompt
from ninfer.engine.facade import Engine
from ninfer.config import EngineRequestError
from support.program_util import tiny_parts, tiny_program

from support.program_media import GREEDY, FakeEncoder, generate as _generate, media_request as _request


def _prompt(req):
    media = tuple(MediaPlaceholder(m.kind, m.offset, m.length, m.digest, pixel_values=[0.0], grid_thw=m.grid_thw)
                  for m in req.media)
    return PreparedPrompt(token_ids=req.prompt_token_ids, media=media, rope_positions=req.rope_positions,
                          rope_delta=req.rope_delta)


def test_engine_runs_a_prompt_with_media_as_the_program_does(tiny_artifact_path):
    frontend, make_program = tiny_parts(tiny_artifact_path, "dense", page_size=16, num_pages=64, num_slots=4,
                                        max_model_len=128, max_batch=4)
    ref_prog = make_program()
    ref_prog.vision = FakeEncoder(ref_prog.dims.hidden_size)
    want = _generate(ref_prog, _request(10), [18], 10)
    prog = make_program()
    prog.vision = FakeEncoder(prog.dims.hidden_size)
    with Engine.from_program(prog, frontend, EngineConfig(max_model_len=128, prefill_chunk_tokens=7)) as eng:
        assert eng.wait_ready(30).ready
        for _ in range(2):
            r = eng.submit(_prompt(_request(10)), GREEDY, max_tokens=10, output=OutputOptions(ignore_eos=True))
            assert list(r.result().token_ids) == want
        m = eng.metrics()
        assert m.num_cache_hits == 1                    # the second run reused the first one's prompt
        assert m.running == 0 and m.outstanding == 0


def test_an_engine_without_vision_refuses_media(tiny_artifact_path):
    frontend, _ = tiny_parts(tiny_artifact_path, "dense")
    text_only = tiny_program(tiny_artifact_path, "dense", num_pages=64, num_slots=4, max_model_len=128, max_batch=4)
    assert not text_only.supports_media                  # the text-layout artifact has no vision tower
    with Engine.from_program(text_only, frontend, EngineConfig(max_model_len=128)) as eng:
        assert eng.wait_ready(30).ready
        with pytest.raises(EngineRequestError, match="has no vision tower"):
            eng.submit(_prompt(_request(10)), GREEDY, max_tokens=4)


def test_media_over_the_planned_workspace_is_refused_at_submit(tiny_artifact_path):
    frontend, make_program = tiny_parts(tiny_artifact_path, "dense", page_size=16, num_pages=64, num_slots=4,
                                        max_model_len=128, max_batch=4, max_media_patches=20)
    prog = make_program()
    assert prog.media_patch_limit == 20
    with Engine.from_program(prog, frontend, EngineConfig(max_model_len=128)) as eng:
        assert eng.wait_ready(30).ready
        with pytest.raises(EngineRequestError, match="media part 0 \\(image\\) has 24 patches, over the 20"):
            eng.submit(_prompt(_request(10)), GREEDY, max_tokens=4)
        assert eng.metrics().outstanding == 0
