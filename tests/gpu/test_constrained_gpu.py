"""Grammar-constrained decoding on CUDA: the Triton bitmask pass equals the reference (also inside a captured
graph); the decode CUDA graphs with their token-mask input give the eager Program's tokens for constrained
rows mixed with free ones (multi-step rounds, prefix commits, cancelled rows, aborts, a pipelined free round
with its step-ahead before a constrained one), the grammar following exactly the committed tokens, and the
mask rows back to all ones after a free round; through the Engine, MTP rounds on the speculative graphs give
the plain eager Engine's greedy constrained output."""
from __future__ import annotations

import importlib
import json

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from ninfer import Engine, EngineConfig  # noqa: E402
from ninfer.contract.frontend import FinishReason, OutputConstraint, OutputOptions  # noqa: E402
from ninfer.contract.program import SamplingParams, SequenceRequest  # noqa: E402
from ninfer.ops.reference.sampling import apply_token_bitmask_ as reference_mask  # noqa: E402
from ninfer.ops.triton.sampling import apply_token_bitmask_ as fast_mask  # noqa: E402
from support.program_util import commit_by_rule, decode_n, extend_rows, force_tokens  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.frontend import Qwen36Frontend  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "b": {"type": "string", "maxLength": 6}},
          "required": ["a", "b"], "additionalProperties": False}
SCHEDULE = [(2, "all"), (2, ["prefix", "all", "cancel", "prefix"]), (1, "abort"), (2, ["all", "prefix", "all", "all"]),
            (2, ["cancel", "all", "prefix", "all"]), (1, "all"), (2, "all"), (2, "all")]


@pytest.mark.parametrize("B,V", [(1, 100), (3, 248320), (8, 248077), (5, 4097)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_pass_equals_reference(B, V, dtype):
    g = torch.Generator(device="cuda").manual_seed(B * V)
    W = (V + 31) // 32 + (1 if V == 100 else 0)                    # a mask wider than the vocabulary too
    mask = torch.randint(-2**31, 2**31 - 1, (B, W), dtype=torch.int32, device="cuda", generator=g)
    mask[0] = -1                                                    # an all-ones row stays unchanged
    x = torch.randn(B, V, device="cuda", dtype=dtype, generator=g)
    ref, got = x.clone(), x.clone()
    reference_mask(ref, mask)
    fast_mask(got, mask)
    assert torch.equal(ref, got)
    assert torch.equal(got[0], x[0])
    # inside a captured graph: the mask is data
    static_x, static_m = x.clone(), torch.full_like(mask, -1)
    graph = torch.cuda.CUDAGraph()
    fast_mask(static_x.clone(), static_m)                           # compile outside the capture
    with torch.cuda.graph(graph):
        fast_mask(static_x, static_m)
    static_x.copy_(x)
    static_m.copy_(mask)
    graph.replay()
    assert torch.equal(static_x, ref)


def _run(mode: str):
    fe = Qwen36Frontend.builtin()
    w = DummyWeights("qwen3_6-tiny-dense", device="cuda", dtype=torch.float32, seed=7, std=0.2)
    pkg = importlib.import_module(w.package.module)
    cfg = ProgramConfig(device="cuda", dtype="fp32", page_size=16, num_pages=128, num_slots=8, max_model_len=128,
                        max_batch=4, max_steps=2, enforce_eager=(mode != "graphs"),
                        sampleable_vocab_size=fe.vocab_size)
    prog = pkg.create_program(w, cfg)
    assert (prog.graphs is not None) == (mode == "graphs")
    prompt = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": False})
    specs = [OutputConstraint("json_schema", json.dumps(SCHEMA), "s"), OutputConstraint("regex", r"[a-z]{3,}", "r"),
             None, OutputConstraint("choice", '["first", "second"]', "c")]
    cons = [fe.new_token_constraint(prompt, c) if c is not None else None for c in specs]
    samplings = [GREEDY, SamplingParams(temperature=1.0, seed=5), GREEDY, GREEDY]

    def start(sampling, constraint):
        req = SequenceRequest(prompt_token_ids=prompt.token_ids, max_output_tokens=60, sampling=sampling,
                              constraint=constraint)
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        while True:                                  # 1-token stages: the decode kernels (no fla compile)
            step = prog.prefill(h, 1)
            if step.pending is not None:
                prog.commit(step.pending, [1])
                return h, [step.pending.rows[0].tokens[0]]

    free = [start(GREEDY, None) for _ in range(2)]
    rows = [start(s, c) for s, c in zip(samplings, cons)]
    seqs, out = [h for h, _ in rows], [o for _, o in rows]
    free_out = []
    for i, (steps, decision) in enumerate(SCHEDULE):
        if i == 3:                                   # a pipelined free round (and its step-ahead) first
            b = prog.decode([h for h, _ in free], 2)
            prog.commit(b, [2, 2])
            free_out.append([r.tokens for r in b.rows])
        commit_by_rule(prog, prog.decode(seqs, steps), decision, out)
        for c, o in zip(cons, out):
            if c is not None:
                assert c.num_consumed == len(o)
    masked = prog.graphs.mask_replays if mode == "graphs" else 0
    b = prog.decode([h for h, _ in free], 1)        # a free round after the masked ones: no mask pass
    prog.commit(b, [1, 1])
    free_out.append([r.tokens for r in b.rows])
    if mode == "graphs":
        assert prog.graphs.replays > 0 and prog.graphs.mask_replays == masked > 0
    for h in seqs + [h for h, _ in free]:
        prog.release(h)
    prog.check_integrity()
    for c, spec, o in zip(cons, specs, out):
        if c is not None:
            assert fe.new_token_constraint(prompt, spec).validate(o) == len(o)
    return out, free_out


def test_constrained_graph_decode_equals_eager():
    assert _run("graphs") == _run("eager")


def _run_thinking(mode: str):
    """A constrained row inside its reasoning rides pipelined one-step rounds (with their step-ahead) beside a
    free row; a forced `</think>` (control) ends that, and the masked rounds follow unpipelined."""
    fe = Qwen36Frontend.builtin()
    w = DummyWeights("qwen3_6-tiny-dense", device="cuda", dtype=torch.float32, seed=7, std=0.2)
    pkg = importlib.import_module(w.package.module)
    prog = pkg.create_program(w, ProgramConfig(device="cuda", dtype="fp32", page_size=16, num_pages=128, num_slots=8,
                                               max_model_len=128, max_batch=4, max_steps=4,
                                               enforce_eager=(mode != "graphs"), sampleable_vocab_size=fe.vocab_size))
    prompt = fe.prepare_chat([{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": True})
    spec = OutputConstraint("json_schema", json.dumps(SCHEMA), "s")
    tc = fe.new_token_constraint(prompt, spec)
    hs, out = [], []
    for c in (None, tc):
        req = SequenceRequest(prompt_token_ids=prompt.token_ids, max_output_tokens=60, sampling=GREEDY, constraint=c)
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        while (step := prog.prefill(h, 1)).pending is None:
            pass
        prog.commit(step.pending, [1])
        hs.append(h)
        out.append(list(step.pending.rows[0].tokens))
    extend_rows(out, decode_n(prog, hs, 6))
    assert tc.free
    force_tokens(prog, hs[1], fe.tokenizer.encode("\n</think>\n\n"), out[1])
    assert not tc.free
    answer_from = len(out[1])
    extend_rows(out, decode_n(prog, hs, 12))
    assert tc.num_consumed == len(out[1])
    fresh = fe.new_token_constraint(prompt, spec)
    assert fresh.validate(out[1]) == len(out[1])
    adopted = prog.step_ahead_counts["adopted"]
    for h in hs:
        prog.release(h)
    prog.check_integrity()
    return out, answer_from, adopted


def test_constrained_reasoning_rows_pipelined_then_masked():
    graphed, n, adopted = _run_thinking("graphs")
    eager, n2, _ = _run_thinking("eager")
    assert graphed == eager and n == n2
    assert adopted > 0                               # the reasoning rounds ran pipelined


def test_constrained_speculative_graphs_equal_plain_eager(tiny_artifact_path):
    path = tiny_artifact_path("moe")
    cons = [OutputConstraint("json_schema", json.dumps(SCHEMA), "s"), OutputConstraint("regex", r"[a-c]{2,6}", "r"),
            OutputConstraint("choice", '["ab", "cd"]', "c")]
    results = []
    for spec, eager in ((None, True), ({"method": "mtp", "num_speculative_tokens": 3}, False)):
        cfg = EngineConfig(device="cuda", dtype="fp32", max_concurrency=8, max_model_len=128, page_size=16,
                           enforce_eager=eager, speculative=spec)
        with Engine(path, cfg) as eng:
            assert eng.wait_ready(300).ready
            prompt = eng.frontend.prepare_chat([{"role": "user", "content": "x"}],
                                               chat_template_kwargs={"enable_thinking": False})
            hs = [eng.submit(prompt, GREEDY, max_tokens=40, output=OutputOptions(constraint=c)) for c in cons * 2]
            hs.append(eng.submit(prompt, GREEDY, max_tokens=10))
            finals = [list(h)[-1] for h in hs]
            results.append([(f.token_ids, f.finish_reason) for f in finals])
    assert results[0] == results[1]
    assert all(r[1] in (FinishReason.STOP, FinishReason.LENGTH) for r in results[0])
