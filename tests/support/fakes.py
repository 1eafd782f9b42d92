"""Test doubles for the Engine: a scripted Program with real page/slot accounting and PendingBatch
semantics, and a small Frontend whose OutputSession follows the preview/commit/finish protocol.

FakeProgram is strict: it raises InvariantError for everything the real Program must refuse
(stale handles, a unit for a sequence with an unconsumed batch, double consumption, a resource
transition while a batch is open, committing beyond the reservation), so engine tests that run
against it check the Engine's side of the contract. Tokens are a deterministic function of the
sequence's own history, so a request's output does not depend on its batch neighbours unless
the Engine mixes rows up.

    pages   0 .. num_pages-1    free list, lowest id first; a sequence owns ceil(reservation/page_size)
    slots   0 .. num_slots-1    one StateImage slot per sequence

Speculation (`FakeProgram(speculative=K)`): `lookahead` is K and every decode unit is one speculative
round per row: the row produces a+1 tokens (a accepted drafts, 0..K, from the `spec_accept(seq_id,
round)` script; the tokens are the same deterministic continuation as without speculation) with
`drafted` = K. A round refuses a row whose reservation lacks the K positions past its last token
(the Engine must reserve the lookahead). `spec_rounds` records (sequence, drafted, produced) per row.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ninfer.contract.program import (BatchKind, CapacitySummary, InvariantError, PendingBatch, PendingRow,
                                           PrefillStep, Refusal, RefusalKind, ResourcePlan, ResourceResult,
                                           SequenceHandle, SequenceRequest, StalePlanError, TokenLogprob)
from ninfer.contract.frontend import FinalOutput, FinishReason, OutputDelta, OutputOptions, Preview

EOS = 2
THINK_END = 5
FIRST_REGULAR = 10


class InjectedFault(RuntimeError):
    pass


@dataclass
class FakeSeq:
    handle: SequenceHandle
    prompt: tuple[int, ...]
    max_output: int
    lookahead: int
    pages: list[int]
    slot: int
    computed: int = 0
    output: list[int] = field(default_factory=list)


def next_token(prompt: Sequence[int], output: Sequence[int], vocab: int, eos_mod: int) -> int:
    """Deterministic 'model': a hash of the sequence history; EOS about once in eos_mod tokens."""
    h = 1469598103934665603
    for t in itertools.chain(prompt, (-1,), output):
        h = ((h ^ (t & 0xFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    if eos_mod and (h >> 17) % eos_mod == 0:
        return EOS
    return FIRST_REGULAR + (h >> 7) % (vocab - FIRST_REGULAR)


class FakeProgram:
    def __init__(self, *, num_pages: int = 64, page_size: int = 4, num_slots: int = 8, max_model_len: int = 256,
                 max_batch: int = 8, vocab: int = 500, eos_mod: int = 0, lookahead: int = 0,
                 trace: Callable[[str, dict], None] | None = None, speculative: int = 0,
                 spec_accept: Callable[[int, int], int] | None = None):
        self.num_pages, self.page_size, self.num_slots = num_pages, page_size, num_slots
        self._max_model_len, self.max_batch, self.vocab, self.eos_mod = max_model_len, max_batch, vocab, eos_mod
        self.speculative = speculative
        self.lookahead = speculative or lookahead
        self.spec_accept = spec_accept or (lambda seq_id, rnd: (seq_id + rnd) % (speculative + 1))
        self.spec_rounds: list[tuple[SequenceHandle, int, int]] = []
        self._spec_round_no: dict[int, int] = {}
        self.trace = trace
        self._free_pages = list(range(num_pages))
        self._free_slots = list(range(num_slots))
        self._seqs: dict[int, FakeSeq] = {}
        self._generation: dict[int, int] = {}
        self._seq_ids = itertools.count(1)
        self._plan_ids = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._open: dict[int, tuple[PendingBatch, tuple[int, ...]]] = {}
        self._revision = 0
        self.decode_sizes: list[int] = []          # B of every decode unit, as Program saw it
        self.calls: list[str] = []
        self.faults: dict[str, int] = {}           # method -> raise InjectedFault on its n-th call (1-based)
        self.on_call: Callable[[str], None] | None = None
        self.infeasible: Callable[[SequenceRequest], bool] = lambda req: False
        self.backfill_proofs: list[bool] = []

    # ---- helpers ----------------------------------------------------------------------------
    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if self.on_call is not None:
            self.on_call(name)
        n = self.calls.count(name)
        if self.faults.get(name) == n:
            raise InjectedFault(f"injected fault in {name} (call {n})")

    def _seq(self, handle: SequenceHandle) -> FakeSeq:
        seq = self._seqs.get(handle.seq_id)
        if seq is None or seq.handle != handle:
            raise InvariantError(f"stale or unknown sequence handle {handle}")
        return seq

    def _busy(self, seq_id: int) -> bool:
        return any(seq_id in ids for _, ids in self._open.values())

    def _pages_for(self, req: SequenceRequest) -> int:
        return math.ceil((len(req.prompt_token_ids) + req.max_output_tokens + req.lookahead) / self.page_size)

    def _emit(self, what: str, **info) -> None:
        if self.trace is not None:
            self.trace(what, info)

    # ---- Program protocol: resources -----------------------------------------------------------
    @property
    def resource_revision(self) -> int:
        return self._revision

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def capacity(self) -> CapacitySummary:
        return CapacitySummary(self.num_pages, len(self._free_pages), self.num_slots, len(self._free_slots),
                               self.page_size)

    def plan_materialize(self, request: SequenceRequest) -> ResourcePlan | Refusal:
        self._enter("plan_materialize")
        total = len(request.prompt_token_ids) + request.max_output_tokens + request.lookahead
        pages = self._pages_for(request)
        if total > self._max_model_len or pages > self.num_pages or self.infeasible(request):
            return Refusal(RefusalKind.INFEASIBLE, f"needs {pages} pages / {total} tokens; "
                                                  f"pool {self.num_pages}, max_model_len {self._max_model_len}")
        if pages > len(self._free_pages) or not self._free_slots:
            return Refusal(RefusalKind.SHORT_NOW, f"needs {pages} pages, {len(self._free_pages)} free; "
                                                  f"{len(self._free_slots)} slots free")
        return ResourcePlan(next(self._plan_ids), self._revision, request, pages, 1)

    def start_materialize(self, plan: ResourcePlan) -> ResourceResult:
        self._enter("start_materialize")
        if self._open:
            raise InvariantError("resource transition while a PendingBatch is open")
        if plan.resource_revision != self._revision:
            raise StalePlanError(f"plan {plan.plan_id} for revision {plan.resource_revision}, now {self._revision}")
        pages = [self._free_pages.pop(0) for _ in range(plan.pages)]
        slot = self._free_slots.pop(0)
        sid = next(self._seq_ids)
        handle = SequenceHandle(sid, self._generation.get(sid, 0) + 1)
        self._generation[sid] = handle.generation
        req = plan.request
        self._seqs[sid] = FakeSeq(handle, tuple(req.prompt_token_ids), req.max_output_tokens, req.lookahead,
                                  pages, slot)
        self._revision += 1
        self._emit("program.materialized", sequence=handle, pages=len(pages))
        return ResourceResult(True, self._revision, handle, 0, len(pages), 1)

    def prove_backfill(self, head: SequenceRequest, donors: Sequence[SequenceHandle],
                       borrower: SequenceRequest) -> bool:
        self._enter("prove_backfill")
        donor_pages = sum(len(self._seq(d).pages) for d in donors)
        pages_ok = len(self._free_pages) - self._pages_for(borrower) + donor_pages >= self._pages_for(head)
        slots_ok = len(self._free_slots) - 1 + len(donors) >= 1
        proof = pages_ok and slots_ok
        self.backfill_proofs.append(proof)
        return proof

    def release(self, seq: SequenceHandle) -> ResourceResult:
        self._enter("release")
        s = self._seq(seq)
        if self._open:
            raise InvariantError("resource transition while a PendingBatch is open")
        self._free_pages.extend(s.pages)
        self._free_pages.sort()
        self._free_slots.append(s.slot)
        self._free_slots.sort()
        del self._seqs[seq.seq_id]
        self._revision += 1
        self._emit("program.released", sequence=seq)
        return ResourceResult(True, self._revision, seq, 0, 0, 0)

    # ---- Program protocol: model transactions --------------------------------------------------
    def _open_batch(self, kind: BatchKind, seqs: Sequence[FakeSeq], tokens: Sequence[tuple[int, ...]],
                    logprobs: bool, drafted: int = 0) -> PendingBatch:
        rows = []
        for s, toks in zip(seqs, tokens):
            lp = tuple(TokenLogprob(t, -0.5, ()) for t in toks) if logprobs else None
            rows.append(PendingRow(s.handle, tuple(toks), lp, drafted))
        batch = PendingBatch(next(self._batch_ids), kind, tuple(rows))
        self._open[batch.batch_id] = (batch, tuple(s.handle.seq_id for s in seqs))
        return batch

    def _produce(self, s: FakeSeq, n: int) -> tuple[int, ...]:
        out = list(s.output)
        for _ in range(n):
            out.append(next_token(s.prompt, out, self.vocab, self.eos_mod))
        return tuple(out[len(s.output):])

    def prefill(self, seq: SequenceHandle, max_tokens: int) -> PrefillStep:
        self._enter("prefill")
        s = self._seq(seq)
        if self._busy(seq.seq_id) or s.computed >= len(s.prompt) or max_tokens < 1:
            raise InvariantError(f"prefill of {seq}: computed {s.computed}/{len(s.prompt)}, max {max_tokens}")
        s.computed = min(len(s.prompt), s.computed + max_tokens)
        if s.computed < len(s.prompt):
            return PrefillStep(s.computed, None)
        return PrefillStep(s.computed, self._open_batch(BatchKind.PREFILL, [s], [self._produce(s, 1)], True))

    def decode(self, seqs: Sequence[SequenceHandle], num_steps: int = 1) -> PendingBatch:
        self._enter("decode")
        if not (1 <= len(seqs) <= self.max_batch):
            raise InvariantError(f"decode batch of {len(seqs)} rows (max {self.max_batch})")
        ss = [self._seq(h) for h in seqs]
        if len({h.seq_id for h in seqs}) != len(seqs):
            raise InvariantError("a sequence appears twice in one decode batch")
        for s in ss:
            if self._busy(s.handle.seq_id) or s.computed < len(s.prompt) or not s.output:
                raise InvariantError(f"decode of {s.handle} before its prompt and first token are committed")
        self.decode_sizes.append(len(seqs))
        if not self.speculative:
            return self._open_batch(BatchKind.DECODE, ss, [self._produce(s, num_steps) for s in ss], True)
        K, tokens = self.speculative, []
        for s in ss:
            if len(s.output) + K > s.max_output + s.lookahead:
                raise InvariantError(f"speculative round of {s.handle} writes {K} positions past output "
                                     f"{len(s.output)}, beyond its reservation of {s.max_output} + lookahead "
                                     f"{s.lookahead}")
            rnd = self._spec_round_no.get(s.handle.seq_id, 0)
            self._spec_round_no[s.handle.seq_id] = rnd + 1
            a = self.spec_accept(s.handle.seq_id, rnd)
            if not 0 <= a <= K:
                raise AssertionError(f"spec_accept script gave {a} accepted drafts, not in 0..{K}")
            tokens.append(self._produce(s, a + 1))
            self.spec_rounds.append((s.handle, K, a + 1))
        return self._open_batch(BatchKind.DECODE, ss, tokens, True, drafted=K)

    def control(self, seq: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        self._enter("control")
        s = self._seq(seq)
        if self._busy(seq.seq_id) or not tokens:
            raise InvariantError(f"control unit for {seq} (busy or no tokens)")
        return self._open_batch(BatchKind.CONTROL, [s], [tuple(tokens)], False)

    def _take(self, batch: PendingBatch) -> tuple[int, ...]:
        entry = self._open.get(batch.batch_id)
        if entry is None or entry[0] is not batch or batch.consumed:
            raise InvariantError(f"PendingBatch {batch.batch_id} is not open (consumed twice or foreign)")
        return entry[1]

    def commit(self, batch: PendingBatch, accepted: Sequence[int]) -> None:
        self._enter("commit")
        ids = self._take(batch)
        if len(accepted) != batch.size:
            raise InvariantError(f"commit of {len(accepted)} decisions for {batch.size} rows")
        for row, a in zip(batch.rows, accepted):
            if not (0 <= a <= row.produced_tokens):
                raise InvariantError(f"row {row.sequence} accepts {a} of {row.produced_tokens}")
        if self.faults.get("commit.torn") == self.calls.count("commit"):
            s = self._seqs[ids[0]]
            s.output.extend(batch.rows[0].tokens[:accepted[0]])     # torn: first row applied, then failure
            raise InjectedFault("injected fault mid-commit")
        for sid, row, a in zip(ids, batch.rows, accepted):
            s = self._seqs[sid]
            if len(s.output) + a > s.max_output:
                raise InvariantError(f"{s.handle} commits beyond its reservation of {s.max_output} output tokens")
            s.output.extend(row.tokens[:a])
        batch.consumed = True
        del self._open[batch.batch_id]
        self._emit("program.commit", batch=batch.batch_id,
                   rows={row.sequence: tuple(row.tokens[:a]) for row, a in zip(batch.rows, accepted)})

    def abort_pending(self, batch: PendingBatch) -> None:
        self._enter("abort_pending")
        self._take(batch)
        batch.consumed = True
        del self._open[batch.batch_id]
        self._emit("program.abort", batch=batch.batch_id)

    def check_integrity(self) -> None:
        owned_pages = [p for s in self._seqs.values() for p in s.pages]
        owned_slots = [s.slot for s in self._seqs.values()]
        if sorted(owned_pages + self._free_pages) != list(range(self.num_pages)):
            raise InvariantError(f"pages: free {len(self._free_pages)} + owned {len(owned_pages)} != {self.num_pages}")
        if sorted(owned_slots + self._free_slots) != list(range(self.num_slots)):
            raise InvariantError(f"slots: free {len(self._free_slots)} + owned {len(owned_slots)} != {self.num_slots}")

    # ---- test introspection ----------------------------------------------------------------------
    @property
    def num_open_batches(self) -> int:
        return len(self._open)

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def committed_output(self, handle: SequenceHandle) -> tuple[int, ...]:
        return tuple(self._seq(handle).output)

    def reservation_pages(self, handle: SequenceHandle) -> int:
        return len(self._seq(handle).pages)

    def reference(self, prompt: Sequence[int], max_tokens: int, stop_ids: Sequence[int] = (EOS,)) -> tuple[int, ...]:
        """What one sequence alone generates (greedy), for parity checks."""
        out: list[int] = []
        while len(out) < max_tokens:
            t = next_token(prompt, out, self.vocab, self.eos_mod)
            out.append(t)
            if t in stop_ids:
                break
        return tuple(out)


# ============================================================================================
class FakeFrontend:
    """Renders token t as '<t>'; EOS and stop_token_ids stop; THINK_END closes a thinking block."""
    eos_token_ids = (EOS,)

    def __init__(self, trace: Callable[[str, dict], None] | None = None):
        self.trace = trace
        self.sessions: list[FakeSession] = []

    def new_session(self, prompt, options: OutputOptions) -> "FakeSession":
        if options.thinking_budget is not None and options.thinking_budget < 0:
            raise ValueError("thinking_budget must be >= 0")
        s = FakeSession(prompt, options, self.trace)
        self.sessions.append(s)
        return s


@dataclass
class _State:
    text: str = ""
    reasoning: str = ""
    thinking: bool = False
    num_reasoning: int = 0
    tokens: tuple[int, ...] = ()


class FakeSession:
    def __init__(self, prompt, options: OutputOptions, trace):
        self.options = options
        self.trace = trace
        self.state = _State(thinking=prompt.enable_thinking)
        self._staged: tuple[Preview, _State] | None = None
        self.finished = False
        self.num_commits = 0
        stops = set(options.stop_token_ids)
        if not options.ignore_eos:
            stops.add(EOS)
        self.stops = stops

    def preview(self, tokens: Sequence[int], *, control: bool = False) -> Preview:
        assert not self.finished, "preview after finish"
        if control:
            assert tuple(tokens) == self.forced_control(), "control preview of tokens Frontend did not force"
        st = _State(**vars(self.state))
        text = reasoning = ""
        accepted, terminal, reason, boundary, n_reason = 0, False, None, None, 0
        for t in tokens:
            accepted += 1
            if t in self.stops and not control:
                terminal, reason = True, FinishReason.STOP
                break
            if st.thinking:
                if t == THINK_END:
                    st.thinking = False
                    boundary = accepted
                else:
                    reasoning += f"<{t}>"
                    n_reason += 1
            else:
                text += f"<{t}>"
        st.text += text
        st.reasoning += reasoning
        st.num_reasoning += n_reason
        st.tokens = self.state.tokens + tuple(tokens[:accepted])
        p = Preview(accepted, OutputDelta(text=text, reasoning=reasoning), terminal, reason, boundary, n_reason)
        self._staged = (p, st)
        return p

    def commit(self, preview: Preview) -> None:
        assert self._staged is not None and self._staged[0] is preview, "commit of a preview that is not the last one"
        self.state = self._staged[1]
        self._staged = None
        self.num_commits += 1
        if self.trace is not None:
            self.trace("session.commit", {"session": id(self), "tokens": self.state.tokens})

    def forced_control(self) -> tuple[int, ...] | None:
        budget = self.options.thinking_budget
        if self.state.thinking and budget is not None and self.state.num_reasoning >= budget:
            return (THINK_END,)
        return None

    def finish(self, reason: FinishReason) -> tuple[OutputDelta, FinalOutput]:
        assert not self.finished, "finish twice"
        self.finished = True
        st = self.state
        return OutputDelta(), FinalOutput(st.text, st.reasoning, (), reason, st.tokens, st.num_reasoning)


# ============================================================================================
# Harness: a step-driven EngineCore over the fakes, with a trace that checks publication order.
# ============================================================================================
class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


class Trace:
    """Shared trace of Engine and FakeProgram events; checks invariant 7 on every publication.

    A delta's tokens must already be committed by Program (a "program.commit" of that sequence)
    and by the request's OutputSession ("session_commit"), in that order, before "publish".
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []
        self.seq_of: dict[str, SequenceHandle] = {}
        self.program_committed: dict[SequenceHandle, list[int]] = {}
        self.session_committed: dict[str, list[int]] = {}
        self.published: dict[str, list[int]] = {}
        self.finals: dict[str, int] = {}
        self.violations: list[str] = []
        self.extra: list[Callable[[str, dict], None]] = []

    def __call__(self, what: str, info: dict) -> None:
        from ninfer.config import GenerationDelta, GenerationError, GenerationResult
        self.events.append((what, info))
        rid = info.get("request_id")
        if what == "active":
            self.seq_of[rid] = info["sequence"]
        elif what == "program.commit":
            for seq, toks in info["rows"].items():
                self.program_committed.setdefault(seq, []).extend(toks)
        elif what == "session_commit":
            done = self.program_committed.get(self.seq_of.get(rid), [])
            mine = self.session_committed.setdefault(rid, [])
            mine.extend(info["tokens"])
            if done[:len(mine)] != mine:
                self.violations.append(f"{rid}: session committed {mine} before Program committed {done}")
        elif what == "publish":
            ev = info["event"]
            if isinstance(ev, GenerationDelta) and ev.token_ids:
                pub = self.published.setdefault(rid, [])
                pub.extend(ev.token_ids)
                done = self.program_committed.get(self.seq_of.get(rid), [])
                if done[:len(pub)] != pub or self.session_committed.get(rid, [])[:len(pub)] != pub:
                    self.violations.append(f"{rid}: published {pub} before commit (program {done})")
            if isinstance(ev, (GenerationResult, GenerationError)):
                self.finals[rid] = self.finals.get(rid, 0) + 1
                if self.finals[rid] > 1:
                    self.violations.append(f"{rid}: second final event")
        for f in self.extra:
            f(what, info)

    def kinds(self, what: str) -> list[dict]:
        return [i for w, i in self.events if w == what]


def make_prompt(n: int, start: int = 11, *, thinking: bool = False):
    from ninfer.contract.frontend import PreparedPrompt
    return PreparedPrompt(tuple(start + (i * 7) % 300 for i in range(n)), enable_thinking=thinking)


def make_core(program: FakeProgram | None = None, *, max_concurrency: int = 4, queue_size: int = 8,
              request_timeout_s: float = 60.0, prefill_chunk_tokens: int = 4, decode_steps: int = 1,
              trace: Trace | None = None, clock: FakeClock | None = None, frontend=None, **program_kw):
    from ninfer.engine.engine_core import EngineCore
    trace = trace if trace is not None else Trace()
    if program is None:
        program = FakeProgram(trace=trace, **program_kw)
    elif isinstance(program, FakeProgram):
        program.trace = trace
    clock = clock or FakeClock()
    core = EngineCore(frontend or FakeFrontend(), max_concurrency=max_concurrency, queue_size=queue_size,
                      request_timeout_s=request_timeout_s, prefill_chunk_tokens=prefill_chunk_tokens,
                      max_model_len=program.max_model_len, decode_steps=decode_steps, clock=clock, trace=trace)
    core.attach_program(program)
    return core, program, trace, clock


def run_until_idle(core, max_steps: int = 100000) -> int:
    n = 0
    while core.step():
        n += 1
        if n >= max_steps:
            raise AssertionError("engine did not become idle")
    return n


class ProgramProxy:
    """Wraps any Program (fake or real): traces commits/materializations, counts opened and consumed
    PendingBatches, and calls `on_call(name)` before each method (fault and cancellation injection)."""

    def __init__(self, program, trace: Callable[[str, dict], None]):
        self._p = program
        self._trace = trace
        self.on_call: Callable[[str], None] | None = None
        self.opened: set[int] = set()
        self.consumed: list[int] = []
        self.decode_sizes: list[int] = []

    def __getattr__(self, name):
        return getattr(self._p, name)

    @property
    def resource_revision(self) -> int:
        return self._p.resource_revision

    @property
    def max_model_len(self) -> int:
        return self._p.max_model_len

    def _hook(self, name: str) -> None:
        if self.on_call is not None:
            self.on_call(name)

    def start_materialize(self, plan):
        self._hook("start_materialize")
        res = self._p.start_materialize(plan)
        self._trace("program.materialized", {"sequence": res.sequence})
        return res

    def release(self, seq):
        self._hook("release")
        res = self._p.release(seq)
        self._trace("program.released", {"sequence": seq})
        return res

    def prefill(self, seq, max_tokens):
        self._hook("prefill")
        step = self._p.prefill(seq, max_tokens)
        if step.pending is not None:
            self.opened.add(step.pending.batch_id)
        return step

    def decode(self, seqs, num_steps=1):
        self._hook("decode")
        self.decode_sizes.append(len(seqs))
        b = self._p.decode(seqs, num_steps)
        self.opened.add(b.batch_id)
        return b

    def control(self, seq, tokens):
        self._hook("control")
        b = self._p.control(seq, tokens)
        self.opened.add(b.batch_id)
        return b

    def commit(self, batch, accepted):
        self._hook("commit")
        self._p.commit(batch, accepted)
        self.consumed.append(batch.batch_id)
        self._trace("program.commit", {"batch": batch.batch_id,
                                       "rows": {r.sequence: tuple(r.tokens[:a]) for r, a in zip(batch.rows, accepted)}})

    def abort_pending(self, batch):
        self._hook("abort_pending")
        self._p.abort_pending(batch)
        self.consumed.append(batch.batch_id)

    @property
    def num_open_batches(self) -> int:
        return len(self.opened) - len(set(self.consumed))


@contextlib.contextmanager
def young_heap_gc():
    """Within the block, `gc.collect()` scans only the objects made inside it: everything alive at entry
    moves to the collector's permanent generation (gc.freeze) and back at exit. A test that collects
    after each handle drop then costs the same in a long pytest session as alone (a full collection
    there walks every module and tensor the earlier tests left alive). Garbage made inside the block
    is still found: a cycle through an object alive at entry is not garbage."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
