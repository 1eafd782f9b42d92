"""Grammar-constrained output through the Engine on the tiny models (random weights: their text is random,
so only the constraint can make it parse): random JSON schemas validate with `jsonschema`, regexes and
choices match, with thinking on (a small thinking budget closes the reasoning) and off, greedy and drawn,
batched with unconstrained rows; an unsatisfiable constraint ends with "length"; cancelled constrained
requests leak nothing; and with MTP speculation, greedy constrained output equals it without, token for token.
NINFER_LONG_TESTS=1 also runs `ninfer bench decode --json-schema-mask` on the tiny model."""
from __future__ import annotations

import json
import os
import random
import re

import jsonschema
import pytest

from ninfer import Engine, EngineConfig
from ninfer.config import EngineRequestError, ErrorKind, GenerationDelta
from ninfer.contract.frontend import FinishReason, OutputConstraint, OutputOptions
from ninfer.contract.program import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
MAX_TOKENS = 48


def _schema(rng: random.Random, depth: int = 0) -> dict:
    """A small random schema: objects (some properties required), arrays, enums, bounded integers and
    numbers, short strings, booleans, nested up to depth 2."""
    kinds = ["integer", "number", "enum", "string", "boolean"] + (["object", "array"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)}
    if kind == "number":
        # NOTE: multipleOf bounds the fraction's digits (a random model left free repeats digits forever)
        return {"type": "number", "minimum": -10, "maximum": rng.choice([1, 10, 1000]),
                "multipleOf": rng.choice([0.5, 0.25])}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "on", "off", 1, 2, None, True], rng.randint(1, 4))}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(0, 4)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        lo = rng.randint(0, 1)
        return {"type": "array", "items": _schema(rng, depth + 1), "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
    names = rng.sample("abcdefgh", rng.randint(1, 3 - depth))
    return {"type": "object", "properties": {n: _schema(rng, depth + 1) for n in names},
            "required": [n for n in names if rng.random() < 0.7], "additionalProperties": False}


def _object_schema(rng: random.Random) -> dict:
    """An object of 1-3 random properties (objects and arrays among them, one level of nesting more)."""
    names = rng.sample("pqrstuvw", rng.randint(1, 3))
    return {"type": "object", "properties": {n: _schema(rng, 1) for n in names},
            "required": [n for n in names if rng.random() < 0.7], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(tiny_artifact_path):
    with Engine(tiny_artifact_path("dense"), EngineConfig(max_concurrency=8, queue_size=256, max_model_len=160,
                                                          page_size=16)) as eng:
        assert eng.wait_ready(120).ready
        yield eng


def _prompts(eng):
    return {think: eng.frontend.prepare_chat([{"role": "user", "content": "Answer in the format asked."}],
                                             chat_template_kwargs={"enable_thinking": think})
            for think in (False, True)}


def _final(handle):
    evs = list(handle)
    return evs[-1]


def test_random_schemas_regexes_and_choices(engine):
    rng = random.Random(50)
    prompts = _prompts(engine)
    jobs = []                                    # (check, prompt, sampling, options)
    for i in range(100):
        schema = _object_schema(rng)
        jobs.append((("schema", schema), OutputConstraint("json_schema", json.dumps(schema), "schema")))
    regexes = [r"[a-f]{3}-[0-9]{2}", r"(yes|no|maybe)", r"\d{1,3}(\.\d)?", r"[A-Z][a-z]{0,4}", r"x+y?z{2}"]
    for rx in regexes:
        jobs.append((("regex", rx), OutputConstraint("regex", rx, "regex")))
    choices = [["alpha", "beta", "gamma delta"], ["1", "22", "333"], ["Ja", "Nein"]]
    for ch in choices:
        jobs.append((("choice", ch), OutputConstraint("choice", json.dumps(ch), "choice")))
    submitted = []
    for i, (check, c) in enumerate(jobs):
        # NOTE: thinking on for one request in four (each costs a single-row control unit of 3 tokens)
        think = i % 4 == 1
        # NOTE: drawn rows one in six (a round with one runs the whole sampler, most of this test's time)
        sampling = GREEDY if i % 6 else SamplingParams(temperature=1.0, seed=i)
        opts = OutputOptions(constraint=c, thinking_budget=1 if think else None)
        submitted.append((check, think, engine.submit(prompts[think], sampling, max_tokens=MAX_TOKENS, output=opts)))
        if i % 10 == 0:                          # unconstrained rows in the same batches
            submitted.append((None, think, engine.submit(prompts[think], GREEDY, max_tokens=6,
                                                         output=OutputOptions(thinking_budget=1 if think else None))))
    complete = length = tokens = 0
    for check, think, h in submitted:
        ev = _final(h)
        tokens += len(ev.token_ids)
        if check is None:
            continue
        if ev.finish_reason is FinishReason.LENGTH:
            length += 1
            continue
        assert ev.finish_reason is FinishReason.STOP, (check, ev)
        complete += 1
        text = ev.text.strip()
        if think:
            assert ev.reasoning                  # the reasoning stayed free (and separate)
        kind, spec = check
        if kind == "schema":
            jsonschema.validate(json.loads(text), spec)
        elif kind == "regex":
            assert re.fullmatch(spec, text), (spec, text)
        else:
            assert text in spec, (spec, text)
    print(f"{complete} complete, {length} out of tokens, {tokens} tokens")
    assert complete + length == len(jobs)
    assert complete >= 0.9 * len(jobs), f"{length} of {len(jobs)} constrained requests ran out of tokens"
    m = engine.metrics()
    assert m.running == 0 and m.outstanding == 0 and m.outstanding_capacity_free == m.outstanding_capacity


def test_unsatisfiable_cancelled_and_aborted(engine):
    prompts = _prompts(engine)
    # a constraint that does not compile: refused at submit (the caller's thread), naming the field
    with pytest.raises(EngineRequestError) as e:
        engine.submit(prompts[False], GREEDY, max_tokens=4,
                      output=OutputOptions(constraint=OutputConstraint("regex", "(ab", "guided_regex")))
    assert e.value.kind is ErrorKind.INVALID_REQUEST and "guided_regex" in str(e.value)
    # the model cannot finish within max_tokens: "length", never a hang
    ev = _final(engine.submit(prompts[False], GREEDY, max_tokens=6,
                              output=OutputOptions(constraint=OutputConstraint("regex", "a{40}", "regex"))))
    assert ev.finish_reason is FinishReason.LENGTH and set(ev.text.strip()) <= {"a"}
    # cancelled mid-output, greedy and drawn: nothing leaks, and the same request then runs in full
    c = OutputConstraint("json_schema", json.dumps({"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 30}}, "required": ["s"], "additionalProperties": False}), "schema")
    handles = [engine.submit(prompts[False], s, max_tokens=40, output=OutputOptions(constraint=c))
               for s in (GREEDY, SamplingParams(temperature=1.0, seed=1))]
    for h in handles:
        for ev in h:
            if isinstance(ev, GenerationDelta):
                h.cancel()
                break
        for _ in h:
            pass
    full = _final(engine.submit(prompts[False], GREEDY, max_tokens=40, output=OutputOptions(constraint=c)))
    assert full.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    m = engine.metrics()
    assert m.running == 0 and m.outstanding == 0 and m.outstanding_capacity_free == m.outstanding_capacity


def test_speculative_constrained_equals_plain(engine, tiny_artifact_path):
    rng = random.Random(7)
    path = tiny_artifact_path("dense")
    cons = [OutputConstraint("json_schema", json.dumps(_object_schema(rng)), "schema") for _ in range(5)]
    cons += [OutputConstraint("regex", r"[a-c]{2,6}", "regex"), OutputConstraint("choice", '["ab", "cd"]', "c")]

    def run(eng):
        prompts = _prompts(eng)
        hs = [eng.submit(prompts[i % 2 == 1], GREEDY, max_tokens=40,
                         output=OutputOptions(constraint=c, thinking_budget=2 if i % 2 else None))
              for i, c in enumerate(cons)]
        hs.append(eng.submit(prompts[False], GREEDY, max_tokens=10))
        return [(ev.token_ids, ev.finish_reason) for ev in map(_final, hs)]

    # NOTE: the plain run uses the module's engine (same model, batch size and page size; its larger
    # max_model_len and queue do not change these short greedy outputs): one Engine build less
    results = [run(engine)]
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    with Engine(path, EngineConfig(max_concurrency=8, max_model_len=128, page_size=16, speculative=spec)) as eng:
        assert eng.wait_ready(120).ready
        results.append(run(eng))
    assert results[0] == results[1]
    assert sum(r[1] is FinishReason.STOP for r in results[0][:-1]) >= 6


@pytest.mark.skipif(not os.environ.get("NINFER_LONG_TESTS"), reason="a bench run (~7 s): NINFER_LONG_TESTS=1")
def test_bench_decode_json_schema_mask_cpu(capsys):
    from ninfer.gateway.cli.main import main
    rc = main(["bench", "decode", "--identity", "qwen3_6-tiny-dense", "--device", "cpu", "--ctx", "8",
               "--batches", "2", "--reps", "1", "--no-hf-baseline", "--json-schema-mask"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads([ln for ln in out.splitlines() if ln.startswith("JSON ")][0][5:])
    assert not data["errors"]
    compile_rows = [r for r in data["results"] if r["kind"] == "compile"]
    masked = [r for r in data["results"] if r["kind"] == "decode_masked"]
    assert len(compile_rows) == 1 and compile_rows[0]["fields"] == 50 and compile_rows[0]["compile_ms"] > 0
    assert len(masked) == 1 and masked[0]["batch"] == 2 and masked[0]["mask_ratio"] > 0
    assert "masked_ms" in out and "compile_ms" in out
