"""The serve warmup's Gateway side: `/health` and the API routes say "starting" while it runs, a failed
warmup is logged and serving goes on, and `ninfer serve --no-warmup` turns it off. (What `Engine.warm_up`
runs and leaves behind: tests/integration/test_engine_real.py.)"""
from __future__ import annotations

import logging

import pytest

from ninfer.gateway.http import server
from ninfer.gateway.http.app import GatewayState
from ninfer.gateway.http.errors import APIError
from ninfer.config import Availability, AvailabilityState


class _Engine:
    def __init__(self, warm=None, error: Exception | None = None):
        self.availability = Availability(AvailabilityState.READY)
        self._warm, self._error = warm or [], error
        self.calls = 0

    def warm_up(self):
        self.calls += 1
        if self._error is not None:
            raise self._error
        return self._warm


def test_health_says_starting_while_warming():
    state = GatewayState(model_name="m")
    state.engine = _Engine()
    state.warming = True
    st, ready, reason = state.availability()
    assert (st, ready) == ("starting", False) and "warming up" in reason
    with pytest.raises(APIError) as e:
        state.ready_engine()
    assert e.value.status == 503
    state.warming = False
    assert state.availability()[:2] == ("ready", True) and state.ready_engine() is state.engine


def test_failed_warmup_is_logged_and_serving_goes_on(caplog):
    eng = _Engine(error=RuntimeError("CUDA out of memory"))
    with caplog.at_level(logging.INFO, logger="ninfer.gateway.http"):
        server.warm_up(eng)                       # does not raise
        server.warm_up(_Engine(warm=[(64, 0.5), (8192, 1.25)]))
    text = caplog.text
    assert eng.calls == 1 and "warm-up failed" in text and "CUDA out of memory" in text
    assert "warm-up: 2 prompts (64, 8192 tokens)" in text


def test_serve_no_warmup_flag():
    from ninfer.gateway.cli.main import build_parser
    parser, _ = build_parser()
    assert parser.parse_args(["serve"]).warmup is True
    assert parser.parse_args(["serve", "--no-warmup"]).warmup is False
