"""Stop strings inside a speculative round, through the real Qwen3.6 Frontend: a FakeProgram whose
rounds produce several tokens of the same deterministic continuation as plain decoding, so the result
with speculation must equal the plain one (text, tokens, finish reason) wherever the stop string ends."""
from __future__ import annotations

import time

import pytest

from ninfer.config import EngineConfig, OutputOptions, SamplingParams
from support.fakes import FakeProgram

K = 3
PROMPT = list(range(2000, 2012))


@pytest.fixture(scope="module")
def frontend():
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
    return Qwen36Frontend.builtin()


def _run(frontend, speculative: bool, max_tokens: int, stop: tuple[str, ...] = ()):
    from ninfer.engine.facade import Engine

    kw = dict(speculative=K, spec_accept=lambda sid, rnd: (K, 2, K, 1)[rnd % 4]) if speculative else {}
    prog = FakeProgram(num_pages=64, page_size=16, max_model_len=256, vocab=5000, **kw)
    cfg = EngineConfig(max_model_len=256, speculative={"method": "mtp", "num_speculative_tokens": K}
                       if speculative else None)
    with Engine.from_program(prog, frontend, cfg) as eng:
        assert eng.wait_ready(10).ready
        r = eng.generate(frontend.prepare_tokens(PROMPT), SamplingParams(temperature=0.0), max_tokens=max_tokens,
                         output=OutputOptions(stop=stop, ignore_eos=True), timeout=30)
        # NOTE: the metrics snapshot is published at the worker's next boundary, which may come after the result
        #       reaches this thread: wait for it (a leak never converges).
        deadline = time.monotonic() + 10
        while eng.metrics().pages_free != eng.metrics().pages_total and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.metrics().pages_free == eng.metrics().pages_total
    return r


def test_stop_strings_at_many_offsets_match_plain_decoding(frontend):
    plain = _run(frontend, False, 40)
    text = plain.text
    assert len(text) > 30
    checked = 0
    for start in range(3, len(text) - 6, 5):
        stop = text[start:start + 3]
        if not stop.strip() or text.find(stop) != start:
            continue
        want = _run(frontend, False, 40, (stop,))
        got = _run(frontend, True, 40, (stop,))
        assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, want.finish_reason)
        assert got.text == text[:start] and got.usage.num_spec_rounds >= 1
        checked += 1
    assert checked >= 3
