"""Grammar-constrained rows in the Program (tiny dense, fp32, CPU): the decode graphs' run contract
(`EagerGraphs`: the graph's input layout and body, then its token mask pass, run eagerly) gives the eager steps'
tokens; a row's grammar state follows exactly its committed tokens through multi-step rounds, prefix
commits, cancelled rows and aborted batches; and every constrained row's committed output is one the
grammar takes."""
from __future__ import annotations

import json

from ninfer.contract.frontend import OutputConstraint
from ninfer.contract.program import SamplingParams
from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
from support.eager_graphs import EagerGraphs
from support.program_util import (GREEDY, commit_by_rule, decode_n, extend_rows, force_tokens, materialize,
                                  prefill_all, tiny_parts)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "b": {"type": "string", "maxLength": 6}},
          "required": ["a", "b"], "additionalProperties": False}
# (steps, decision per row: "all" | "prefix" | "cancel", or "abort" for the batch)
SCHEDULE = [(2, "all"), (2, ["prefix", "all", "cancel", "prefix"]), (1, "abort"), (2, ["all", "prefix", "all", "all"]),
            (2, ["cancel", "all", "prefix", "all"]), (2, "all")]


def _run(make_program, graphs: bool):
    fe = Qwen36Frontend.builtin()
    prog = make_program()
    if graphs:
        prog.graphs = EagerGraphs(prog, max_batch=4)
    prompt = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": False})
    specs = [OutputConstraint("json_schema", json.dumps(SCHEMA), "s"), OutputConstraint("regex", r"[a-z]{3,}", "r"),
             None, OutputConstraint("choice", '["first", "second"]', "c")]
    cons = [fe.new_token_constraint(prompt, c) if c is not None else None for c in specs]
    samplings = [GREEDY, SamplingParams(temperature=1.0, seed=5), GREEDY, GREEDY]
    seqs = [materialize(prog, prompt.token_ids, 40, s, constraint=c) for s, c in zip(samplings, cons)]
    out = [[prefill_all(prog, s)[0]] for s in seqs]
    for steps, decision in SCHEDULE:
        commit_by_rule(prog, prog.decode(seqs, steps), decision, out)
        for c, o in zip(cons, out):                  # the grammar moved by exactly the committed tokens
            if c is not None:
                assert c.num_consumed == len(o)
        prog.check_integrity()
    for s in seqs:
        prog.release(s)
    prog.check_integrity()
    replays = (prog.graphs.replays, prog.graphs.mask_replays) if graphs else (0, 0)
    return out, replays


def _eager_and_graphed(tiny_artifact_path, run, max_steps: int):
    """run(make_program, graphs) without, then with the decode graphs' contract, on one tiny dense Program config."""
    _, make_program = tiny_parts(tiny_artifact_path, "dense", page_size=16, num_pages=64, num_slots=6,
                                 max_model_len=128, max_batch=4, max_steps=max_steps)
    return run(make_program, graphs=False), run(make_program, graphs=True)


def test_constrained_rows_graphs_equal_eager_and_follow_commits(tiny_artifact_path):
    (eager, _), (graphed, replays) = _eager_and_graphed(tiny_artifact_path, _run, max_steps=2)
    assert min(replays) > 0 and graphed == eager          # steps and their mask passes through the graphs
    fe = Qwen36Frontend.builtin()
    prompt = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": False})
    tok = fe.tokenizer
    for spec, toks in [(OutputConstraint("json_schema", json.dumps(SCHEMA), "s"), eager[0]),
                       (OutputConstraint("regex", r"[a-z]{3,}", "r"), eager[1]),
                       (OutputConstraint("choice", '["first", "second"]', "c"), eager[3])]:
        fresh = fe.new_token_constraint(prompt, spec)
        assert fresh.validate(toks) == len(toks), (spec.kind, tok.decode(toks))
    # the JSON row completed within its tokens: only the end of turn was left, and it parses
    text = tok.decode(eager[0])
    if eager[0][-1] == 248046:
        json.loads(text)


# one-step rounds, as the Engine runs them: (steps, decision) as in SCHEDULE, and whether the round adopts the
# forward-only step-ahead of the round before it
STEPWISE = [(1, "all", False), (1, "all", True), (1, "all", True), (2, ["prefix", "all"], True), (1, "all", False),
            (1, "abort", True), (1, "all", False), (1, ["all", "cancel"], True), (1, "all", False), (1, "all", True)]


def _run_stepwise(make_program, graphs: bool):
    """Masked one-step rounds of two constrained rows (greedy, drawn): on the graphs each launches the next
    step's forward once it has its tokens, and the next round of the same rows adopts it after a full commit
    (a partial commit, an abort or a cancelled row drops it); the grammar follows the committed tokens."""
    fe = Qwen36Frontend.builtin()
    prog = make_program()
    if graphs:
        prog.graphs = EagerGraphs(prog, max_batch=4)
    prompt = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": False})
    cons = [fe.new_token_constraint(prompt, OutputConstraint("json_schema", json.dumps(SCHEMA), "s")),
            fe.new_token_constraint(prompt, OutputConstraint("regex", r"[a-z]{3,}( [a-z]{2,})*", "r"))]
    samplings = [GREEDY, SamplingParams(temperature=1.0, seed=3)]
    seqs = [materialize(prog, prompt.token_ids, 40, s, constraint=c) for s, c in zip(samplings, cons)]
    out = [[prefill_all(prog, s)[0]] for s in seqs]
    adopted = []
    for steps, decision, _ in STEPWISE:
        before = prog.step_ahead_counts["adopted"]
        commit_by_rule(prog, prog.decode(seqs, steps), decision, out)
        adopted.append(prog.step_ahead_counts["adopted"] > before)
        assert [c.num_consumed for c in cons] == [len(o) for o in out]
        prog.check_integrity()
    for s in seqs:
        prog.release(s)
    prog.check_integrity()
    assert prog.step_ahead.pending is None and prog._pending.num_free_scratch == prog._pending._scratch.total
    return out, adopted


def test_masked_rounds_adopt_forward_only_step_aheads(tiny_artifact_path):
    (eager, none), (graphed, adopted) = _eager_and_graphed(tiny_artifact_path, _run_stepwise, max_steps=2)
    assert graphed == eager
    assert not any(none) and adopted == [a for *_, a in STEPWISE]


def _run_thinking(make_program, graphs: bool):
    """A constrained row inside its reasoning (thinking on) beside a free row: one-step rounds pipelined on
    the graphs (with their step-ahead) while the reasoning is open, a forced `</think>`, then masked rounds."""
    fe = Qwen36Frontend.builtin()
    prog = make_program()
    if graphs:
        prog.graphs = EagerGraphs(prog, max_batch=4)
    prompt = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": True})
    spec = OutputConstraint("json_schema", json.dumps(SCHEMA), "s")
    tc = fe.new_token_constraint(prompt, spec)
    seqs = [materialize(prog, prompt.token_ids, 40, GREEDY, constraint=c) for c in (None, tc)]
    out = [[prefill_all(prog, s)[0]] for s in seqs]
    extend_rows(out, decode_n(prog, seqs, 4))
    assert tc.free
    force_tokens(prog, seqs[1], fe.tokenizer.encode("\n</think>\n\n"), out[1])
    assert not tc.free
    extend_rows(out, decode_n(prog, seqs, 5))
    assert tc.num_consumed == len(out[1]) and fe.new_token_constraint(prompt, spec).validate(out[1]) == len(out[1])
    adopted = prog.step_ahead_counts["adopted"]
    for s in seqs:
        prog.release(s)
    prog.check_integrity()
    return out, adopted


def test_reasoning_rows_pipelined_until_the_grammar_starts(tiny_artifact_path):
    (eager, _), (graphed, adopted) = _eager_and_graphed(tiny_artifact_path, _run_thinking, max_steps=4)
    assert graphed == eager and adopted > 0
