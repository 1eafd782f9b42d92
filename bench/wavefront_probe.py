"""Does a two-stream wavefront prefill pay? (bench/NOTES.md, sessions 27-28.) One prompt of --tokens, split
into two halves A (tokens 0..n/2) and B (the rest, over A as its prefix), timed four ways on one Program
(synthetic weights), interleaved, --reps times after one untimed round:

    one     the whole prompt as one chunk (`Program.prefill`'s path: one `model.forward`)
    seq     A then B on one stream (two chunks, as a chunked prefill runs them)
    wave    A and B layer-interleaved on two streams: B's layer-L state / KV reads wait on an event that
            A records after its layer-L mixer wrote them (conv + delta-rule state, the KV pages); every
            other kernel of B may run beside A's
    indep   two unrelated sequences of n/2 tokens from position 0 on two streams (no events): the most
            the overlap could give, whatever B's attention over a prefix costs

It prints each form's median wall time (CUDA-synchronised, ms) and the largest relative difference of the
last hidden row from `seq` (wave must equal seq bitwise: same kernels, same order per stream).
Without CUDA it runs the tiny dense identity on the CPU reference ops (no streams) as a smoke test of the
schedule's equality.

    PYTHONPATH=$PWD python3 bench/wavefront_probe.py --identity qwen3_6-27b --tokens 8192 --reps 5
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ninfer.bench.common import json_line  # noqa: E402
from ninfer.contract.program import SamplingParams, SequenceRequest  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402
from ninfer.targets.qwen3_6.program.model import ForwardBatch, Qwen36Model, _RowMeta  # noqa: E402
from ninfer.ops.reference.fused import materialize  # noqa: E402
from ninfer.ops.reference.rope import mrope_cos_sin  # noqa: E402

PAGE = 64


class _Events:
    """A's mixers record one event each after the op that writes what B's same layer reads; B's reading
    ops wait on them in the same order (host issue order: A's layer L before B's layer L)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.made, self.used = cuda, [], 0

    def record(self) -> None:
        if self.cuda:
            e = torch.cuda.Event()
            e.record()
            self.made.append(e)

    def wait(self) -> None:
        if self.cuda:
            torch.cuda.current_stream().wait_event(self.made[self.used])
        self.used += 1


def _wrapped(ops, ev: _Events, role: str):
    """ops with A's state / KV writers recording and B's state / KV readers waiting."""
    def after(fn):
        def f(*a, **k):
            out = fn(*a, **k)
            ev.record()
            return out
        return f

    def before(fn):
        def f(*a, **k):
            ev.wait()
            return fn(*a, **k)
        return f

    if role == "A":
        # NOTE: a GDN layer's conv writes its conv state before the delta rule runs; one event after the
        #       delta rule covers both. An attention layer writes its KV in the q/k norm + rotary op.
        return ops._replace(chunk_gated_delta_rule=after(ops.chunk_gated_delta_rule),
                            qk_norm_rope_write_kv=after(ops.qk_norm_rope_write_kv))
    return ops._replace(chunk_causal_conv1d=before(ops.chunk_causal_conv1d),
                        chunk_paged_attention=before(ops.chunk_paged_attention))


def _layer_steps(model: Qwen36Model, fb: ForwardBatch):
    """`Qwen36Model.forward` one layer per `next`; the last `next` returns the final hidden states."""
    d = model.dims
    x = F.embedding(fb.input_ids, model.view.embed_tokens)
    cos, sin = mrope_cos_sin(fb.positions, head_dim=d.head_dim, partial_rotary_factor=d.partial_rotary_factor,
                             mrope_section=d.mrope_section, rope_theta=d.rope_theta, interleaved=d.mrope_interleaved)
    meta = _RowMeta.of(fb, x.device)
    post_mixer = model.leaves.post_mixer
    folds = getattr(post_mixer, "folds_residual", False)
    delta = None
    for layer in model.view.layers:
        h, x = model._norm(x, delta, layer.input_norm)
        if layer.kind == "full_attention":
            delta = model._attention(layer, h, cos, sin, fb, meta, residual=x)
        else:
            delta = model._gdn(layer, h, fb, meta, residual=x)
        h, x = model._norm(x, delta, layer.post_norm)
        delta = (post_mixer(layer.mlp, h, model.ops, residual=x) if folds
                 else post_mixer(layer.mlp, materialize(h, model.ops), model.ops))
        yield None
    yield materialize(model._norm(x, delta, model.view.norm)[0], model.ops)


def _fb(prog, s, start: int, end: int) -> ForwardBatch:
    """The ForwardBatch `Program._forward` builds for tokens start..end of sequence s at its slot."""
    s.holding.table.ensure(end)
    dev = prog.device
    return ForwardBatch(torch.tensor(s.tokens[start:end], dtype=torch.long, device=dev),
                        torch.arange(start, end, dtype=torch.long, device=dev), (end - start,), (start,),
                        torch.tensor([prog._state.phys(s.slot)], dtype=torch.long, device=dev),
                        s.holding.table.as_tensor(len(s.holding.table.pages)).unsqueeze(0).to(dev))


def _two(models, fbs, streams) -> list[torch.Tensor]:
    """Layer-interleaved issue of two forwards, each on its own stream; joined into the current one."""
    cur = torch.cuda.current_stream() if streams else None
    ctx = [torch.cuda.stream(st) if st is not None else contextlib.nullcontext() for st in streams or (None, None)]
    if streams:
        for st in streams:
            st.wait_stream(cur)
    gens, outs = [], [None, None]
    for i in range(2):
        with ctx[i]:
            gens.append(_layer_steps(models[i], fbs[i]))
    done = [False, False]
    while not all(done):
        for i in range(2):
            if done[i]:
                continue
            with ctx[i]:
                r = next(gens[i])
            if r is not None:
                outs[i], done[i] = r, True
    if streams:
        for st in streams:
            cur.wait_stream(st)
    return outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identity", default=None)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--forms", nargs="+", default=["one", "seq", "wave", "indep"])
    ap.add_argument("--pause", type=float, default=0.0, help="seconds idle after each timed form")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    ident = a.identity or ("qwen3_6-27b" if cuda else "qwen3_6-tiny-dense")
    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    w = DummyWeights(ident, device=dev, dtype=dtype, seed=0)
    pkg = importlib.import_module(w.package.module)
    n = a.tokens
    cfg = ProgramConfig(device=dev, dtype="bf16" if cuda else "fp32", page_size=PAGE, num_pages=2 * (n // PAGE + 8),
                        num_slots=3, max_model_len=n + 16, max_batch=1, max_steps=1)
    prog = pkg.create_program(w, cfg)
    rng = torch.Generator().manual_seed(0)
    prompt = tuple(torch.randint(0, w.dims.vocab_size, (n,), generator=rng).tolist())
    other = tuple(torch.randint(0, w.dims.vocab_size, (n // 2,), generator=rng).tolist())
    half = n // 2
    streams = (torch.cuda.Stream(), torch.cuda.Stream()) if cuda else None
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def seqs(*prompts):
        hs = []
        for p in prompts:
            req = SequenceRequest(prompt_token_ids=p, max_output_tokens=2, sampling=SamplingParams(temperature=0.0))
            hs.append(prog.start_materialize(prog.plan_materialize(req)).sequence)
        return hs

    def run(form: str) -> tuple[float, torch.Tensor]:
        hs = seqs(prompt, other) if form == "indep" else seqs(prompt)
        ss = [prog._seq(h) for h in hs]
        s = ss[0]
        try:
            sync()
            t0 = time.perf_counter()
            if form == "one":
                out = prog.model.forward(_fb(prog, s, 0, n))
            elif form == "seq":
                prog.model.forward(_fb(prog, s, 0, half))
                out = prog.model.forward(_fb(prog, s, half, n))
            elif form == "wave":
                ev = _Events(cuda)
                m = prog.model
                ma = Qwen36Model(m.view, m.leaves, m.kv, m.state, ops=_wrapped(m.ops, ev, "A"))
                mb = Qwen36Model(m.view, m.leaves, m.kv, m.state, ops=_wrapped(m.ops, ev, "B"))
                fa, fb = _fb(prog, s, 0, half), _fb(prog, s, half, n)
                out = _two((ma, mb), (fa, fb), streams)[1]
                assert ev.used == len(ev.made) or not cuda, (ev.used, len(ev.made))
            else:
                out = _two((prog.model, prog.model), (_fb(prog, s, 0, half), _fb(prog, ss[1], 0, half)), streams)[0]
            sync()
            ms = (time.perf_counter() - t0) * 1e3
            return ms, out[-1].float().cpu()
        finally:
            for h in hs:
                prog.release(h)

    times = {f: [] for f in a.forms}
    last = {}
    for rep in range(a.reps + 1):
        for f in a.forms:
            ms, row = run(f)
            last[f] = row
            if rep:
                times[f].append(ms)
                time.sleep(a.pause)
            else:
                print(f"[{ident}] {f}: untimed first {ms:.1f} ms", flush=True)
    ref = last.get("seq")
    for f in a.forms:
        med = statistics.median(times[f]) if times[f] else float("nan")
        diff = ""
        if ref is not None and f != "indep":
            rel = ((last[f] - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            diff = f"  last row vs seq: rel {rel:.3g}" + ("  (bitwise equal)" if torch.equal(last[f], ref) else "")
        print(f"[{ident}] {n} tokens  {f:6s} median {med:8.2f} ms  (" + " ".join(f"{t:.1f}" for t in times[f]) +
              f"){diff}", flush=True)
        json_line("wavefront_probe", {"identity": ident, "tokens": n, "form": f,
                                      "median_ms": med, "all_ms": times[f]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
