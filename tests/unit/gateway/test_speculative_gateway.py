"""The gateways' side of speculative decoding, without a model: the spec_decode counters on /metrics
(named as vLLM names them), the output room left by the lookahead (HTTP default max_tokens and its
errors), the request log line, the speculative flags of every command and their one-line errors."""
from __future__ import annotations

import argparse
import logging
from types import SimpleNamespace

import pytest

from ninfer.config import (Availability, AvailabilityState, EngineMetrics, FinishReason, GenerationResult,
                           HistogramSnapshot, SpeculativeConfig, Usage)
from ninfer.gateway.cli.main import CLIError, build_parser
from ninfer.gateway.http.convert import ModelLimits, plan_chat
from ninfer.gateway.http.errors import APIError
from ninfer.gateway.http.metrics import EngineCollector, make_registry, render
from ninfer.gateway.http.protocol import ChatCompletionRequest
from support.serve_util import metric


def _metrics(**kw) -> EngineMetrics:
    h = HistogramSnapshot(bounds=(0.1, 1.0), counts=(1, 2), sum=1.5, count=3)
    base = dict(availability=Availability(AvailabilityState.READY), running=0, waiting=0, max_concurrency=4,
                queue_size=8, outstanding=0, outstanding_capacity=12, outstanding_capacity_free=12,
                pages_total=100, pages_free=100, slots_total=4, slots_free=4, page_size=16,
                num_requests_submitted=0, num_requests_rejected={}, num_prompt_tokens=0, num_reused_tokens=0,
                num_generation_tokens=0, num_finished={}, num_errors={}, num_prefill_units=0,
                num_decode_rounds=0, num_control_units=0, queue_time_s=h, ttft_s=h, inter_token_s=h, e2e_s=h,
                decode_batch_size=h)
    base.update(kw)
    return EngineMetrics(**base)


def _text(m: EngineMetrics) -> str:
    return render(make_registry(EngineCollector(lambda: m, "m", lambda: ("ready", True)))).decode()


def test_spec_decode_counters_as_vllm_names_them():
    text = _text(_metrics(num_speculative_tokens=3, num_spec_drafts=10, num_spec_draft_tokens=30,
                          num_spec_accepted_tokens=17, num_spec_accepted_per_pos=(8, 6, 3)))
    assert metric(text, "ninfer:spec_decode_num_drafts_total") == 10
    assert metric(text, "ninfer:spec_decode_num_draft_tokens_total") == 30
    assert metric(text, "ninfer:spec_decode_num_accepted_tokens_total") == 17
    for i, n in enumerate((8, 6, 3)):
        assert metric(text, "ninfer:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) == n
    assert "# TYPE ninfer:spec_decode_num_drafts_total counter" in text


def test_no_spec_decode_counters_without_speculation():
    text = _text(_metrics())
    assert "spec_decode" not in text


def test_counters_are_present_at_zero_once_speculation_is_on():
    text = _text(_metrics(num_speculative_tokens=2, num_spec_accepted_per_pos=(0, 0)))
    assert metric(text, "ninfer:spec_decode_num_drafts_total") == 0
    assert metric(text, "ninfer:spec_decode_num_accepted_tokens_per_pos_total", position="1") == 0


# ---- HTTP: the lookahead is taken out of the output room ----------------------------------------------
@pytest.fixture(scope="module")
def frontend():
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
    return Qwen36Frontend.builtin()


def test_default_max_tokens_leaves_the_lookahead(frontend):
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hello"}]})
    plain = plan_chat(frontend, req, ModelLimits(max_model_len=1024, vocab_size=248077)).calls[0]
    spec = plan_chat(frontend, req, ModelLimits(max_model_len=1024, vocab_size=248077, lookahead=3)).calls[0]
    n = plain.prompt.num_prompt_tokens
    assert plain.max_tokens == 1024 - n and spec.max_tokens == 1024 - n - 3


def test_max_tokens_over_the_room_names_the_reserved_positions(frontend):
    limits = ModelLimits(max_model_len=1024, vocab_size=248077, lookahead=3)
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hello"}]})
    n = plan_chat(frontend, req, limits).calls[0].prompt.num_prompt_tokens
    ok = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hello"}],
                                               "max_tokens": 1024 - n - 3})
    assert plan_chat(frontend, ok, limits).calls[0].max_tokens == 1024 - n - 3
    over = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hello"}],
                                                 "max_tokens": 1024 - n - 2})
    with pytest.raises(APIError) as e:
        plan_chat(frontend, over, limits)
    assert e.value.status == 400 and e.value.code == "context_length_exceeded" and e.value.param == "max_tokens"
    assert "maximum context length is 1024 tokens (3 of them reserved for speculative decoding)" in e.value.message


def test_the_request_log_line_carries_rounds_and_acceptance_length(caplog):
    from ninfer.gateway.http.runs import Run

    call = SimpleNamespace(prompt=SimpleNamespace(num_prompt_tokens=5))
    usage = Usage(5, 9, num_spec_rounds=4, num_spec_accepted_tokens=4)
    result = GenerationResult("r1", "", "", (), tuple(range(9)), FinishReason.LENGTH, usage)
    with caplog.at_level(logging.INFO, logger="ninfer.gateway.http"):
        Run(call, None, "r1").observe(result)
        plain = GenerationResult("r2", "", "", (), (1,), FinishReason.STOP, Usage(5, 1))
        Run(call, None, "r2").observe(plain)
    lines = [r.getMessage() for r in caplog.records]
    assert "spec_rounds=4 mean_acceptance_length=2.00 finish=length" in lines[0]
    assert "spec_rounds" not in lines[1] and "finish=stop" in lines[1]


# ---- CLI flags ------------------------------------------------------------------------------------------
def _parse(*argv: str) -> argparse.Namespace:
    parser, _ = build_parser()
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv", [("serve",), ("generate", "-p", "x"), ("chat",), ("bench", "decode"),
                                  ("bench", "serve")])
def test_every_command_takes_the_speculative_flags(argv):
    from ninfer.gateway.cli.common import speculative_config

    args = _parse(*argv, "--speculative-method", "mtp", "--num-speculative-tokens", "3")
    assert speculative_config(args) == SpeculativeConfig("mtp", 3, 0)
    assert speculative_config(_parse(*argv)) is None


def test_draft_vocab_size_reaches_the_program_config():
    from types import SimpleNamespace

    from ninfer.engine.facade import _program_config
    from ninfer.gateway.cli.common import engine_config
    from ninfer.targets.qwen3_6.program.config import ProgramConfig

    cfg = engine_config(_parse("serve", "--speculative-method", "mtp", "--num-speculative-tokens", "3",
                               "--draft-vocab-size", "32768", "--device", "cpu"))
    assert cfg.speculative == SpeculativeConfig("mtp", 3, 0, 32768)
    pkg = SimpleNamespace(ProgramConfig=ProgramConfig)
    assert _program_config(pkg, cfg.resolved(False), 1000).draft_vocab_size == 32768


def test_force_accept_len_on_serve():
    from ninfer.gateway.cli.common import speculative_config

    args = _parse("serve", "--speculative-method", "mtp", "--num-speculative-tokens", "3", "--force-accept-len", "4")
    assert speculative_config(args) == SpeculativeConfig("mtp", 3, 4)


@pytest.mark.parametrize("bench", ["decode", "serve"])
def test_the_benches_run_one_engine_per_forced_length_and_plain_with_with_plain(bench):
    from ninfer.bench.args import speculative_configs

    spec = ("--speculative-method", "mtp", "--num-speculative-tokens", "3")
    assert speculative_configs(_parse("bench", bench)) == [None]
    assert speculative_configs(_parse("bench", bench, *spec)) == [SpeculativeConfig("mtp", 3, 0)]
    assert speculative_configs(_parse("bench", bench, *spec, "--force-accept-len", "4")) == [
        SpeculativeConfig("mtp", 3, 4)]
    assert speculative_configs(_parse("bench", bench, *spec, "--force-accept-len", "1", "2", "--with-plain")) == [
        None, SpeculativeConfig("mtp", 3, 1), SpeculativeConfig("mtp", 3, 2)]
    with pytest.raises(CLIError, match="--force-accept-len must be an integer in 0..4"):
        speculative_configs(_parse("bench", bench, *spec, "--force-accept-len", "1", "5"))
    with pytest.raises(CLIError, match="--with-plain needs --speculative-method"):
        speculative_configs(_parse("bench", bench, "--with-plain"))


@pytest.mark.parametrize("argv", [("generate", "-p", "x"), ("chat",)])
def test_force_accept_len_is_not_a_generation_flag(argv, capsys):
    with pytest.raises(SystemExit):
        _parse(*argv, "--speculative-method", "mtp", "--num-speculative-tokens", "3", "--force-accept-len", "2")
    assert "unrecognized arguments: --force-accept-len" in capsys.readouterr().err


def test_score_takes_no_speculative_flags(capsys):
    with pytest.raises(SystemExit):
        _parse("score", "-i", "x.txt", "--speculative-method", "mtp")
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (("--num-speculative-tokens", "3"), "--num-speculative-tokens needs --speculative-method (mtp)"),
    (("--speculative-method", "eagle", "--num-speculative-tokens", "3"),
     "--speculative-method must be one of mtp, got 'eagle'"),
    (("--speculative-method", "mtp"), "--speculative-method mtp needs --num-speculative-tokens K (1..7)"),
    (("--speculative-method", "mtp", "--num-speculative-tokens", "0"),
     "--num-speculative-tokens must be an integer in 1..7, got 0"),
    (("--speculative-method", "mtp", "--num-speculative-tokens", "8"),
     "--num-speculative-tokens must be an integer in 1..7, got 8"),
    (("--speculative-method", "mtp", "--num-speculative-tokens", "two"),
     "--num-speculative-tokens must be an integer in 1..7, got 'two'"),
    (("--force-accept-len", "2"), "--force-accept-len needs --speculative-method (mtp) and --num-speculative-tokens"),
    (("--speculative-method", "mtp", "--num-speculative-tokens", "2", "--force-accept-len", "4"),
     "--force-accept-len must be an integer in 0..3 (0: off; at most --num-speculative-tokens + 1), got 4"),
    (("--draft-vocab-size", "32768"), "--draft-vocab-size needs --speculative-method (mtp)"),
    (("--speculative-method", "mtp", "--num-speculative-tokens", "2", "--draft-vocab-size", "-1"),
     "--draft-vocab-size must be an integer in 0.. (0: all), got -1"),
])
def test_bad_speculative_flags_are_one_line_errors(flags, message):
    from ninfer.gateway.cli.common import engine_config

    with pytest.raises(CLIError) as e:
        engine_config(_parse("serve", *flags))
    assert str(e.value) == message


@pytest.mark.parametrize("bench", ["decode", "serve"])
def test_bench_refuses_bad_speculative_flags_before_running(bench, capsys):
    from ninfer.gateway.cli.main import main

    rc = main(["bench", bench, "--identity", "qwen3_6-tiny-dense", "--device", "cpu",
               "--speculative-method", "mtp", "--num-speculative-tokens", "9"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "ninfer bench: error: --num-speculative-tokens must be an integer in 1..7, got 9"


def test_usage_line_reports_the_acceptance_length():
    from ninfer.gateway.cli.common import usage_line

    r = GenerationResult("r", "", "", (), (1,) * 9, FinishReason.LENGTH,
                         Usage(3, 9, num_spec_rounds=3, num_spec_accepted_tokens=5))
    assert usage_line(r, 0.1, 1.0).endswith("spec_rounds=3 mean_acceptance_length=2.67")
    plain = GenerationResult("r", "", "", (), (1,), FinishReason.LENGTH, Usage(3, 1))
    assert "spec_rounds" not in usage_line(plain, 0.1, 1.0)
