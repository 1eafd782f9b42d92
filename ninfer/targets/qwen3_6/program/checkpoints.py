"""Checkpoints of the Qwen3.6 Program: immutable, complete hybrid state at one frontier.

A checkpoint at frontier F proves the tokens [0, F): the conv + recurrent state of every GDN
layer (one StateImage slot, a copy) and the KV of every attention layer (one reference on each
page of [0, F), shared with whoever else maps it). It records the token digest of exactly those
tokens and its execution provenance. Nothing writes into a published checkpoint:

    checkpoint C, frontier F = 2.5 pages          continuation S materialized from C
    pages   [p0][p1][p2 partial]                   [p0][p1][p2' = copy of p2][p5][p6] ...
    (with the MTP layer the page holding F - 1 is copied even when full: S writes its MTP KV entry there)
    refs     +1  +1  +1                              shared  shared  own (reservation)
    slot     c (copy of the producer's state)        s = copy of c; S writes only s, p2', p5 ...

Capture points (architecture.md §10):
  - `start_capture`: the live sequence's state at its frontier, while it keeps running (the
    Engine stops a prefill stage at the capture point: end of prompt at P - 1, a fixed stride);
  - the publication slot: a sequence that may publish at its terminal step holds one more slot
    from activation. It keeps there the state at its *publication target*: the prompt's
    reconstruction prefix, replaced by the Frontend's output boundaries carried by `commit`.
    A target T is copied into the slot when the state covering exactly [0, T) exists: at the end
    of a prefill stage, in the provisional entry of a committed step, or, for the last sampled
    token (not yet in the state after decode), by one extra token step at the terminal `retain`.
  - `retain`: the terminal step publishes the publication slot's state (or, for a prompt that
    is not a rendered chat, the committed state at the frontier) and releases the rest.

The decode input convention: after a committed step the last sampled token is not in the state,
so a sequence at frontier f with tokens[0..f] proves only [0, f).

Host replicas: an inactive checkpoint may be moved to host memory (state planes + the KV of its
pages); materializing from it copies everything back into the continuation's own slot and pages.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from ninfer.program.block_table import pages_for
from ninfer.program.ledger import CheckpointHolding
from ninfer.contract.program import (CacheUsage, CheckpointInfo, InvariantError, Placement, Provenance,
                                           Refusal, RefusalKind, ResourcePlan, ResourceResult, SequenceHandle,
                                           SequenceRequest, StalePlanError, prefix_digest)


@dataclass(eq=False)
class _Checkpoint:
    info: CheckpointInfo
    tokens: tuple[int, ...]
    holding: CheckpointHolding
    host: dict[str, torch.Tensor] | None = None


class CheckpointOps:
    """Mixed into Qwen36Program: everything about publishing and reusing checkpoints."""

    supports_checkpoints = True

    def _init_checkpoints(self) -> None:
        self._ckpts: dict[int, _Checkpoint] = {}
        self._ckpt_ids = itertools.count(1)
        self._slot_bytes = sum(t[:, 0].numel() * t.element_size() for t in self._state.planes.values())
        self._page_bytes = self._kv.k[:, 0].numel() * self._kv.k.element_size() * 2

    # ---- summaries -----------------------------------------------------------------------
    def _shared_pages(self, F: int) -> int:
        """Pages of a checkpoint at frontier F that a continuation maps shared: the full ones, but with the MTP
        layer not the one holding position F - 1, where the continuation's first MTP KV entry goes (the one
        that pairs F - 1 with the continuation's own token F; speculate.py)."""
        ps = self.config.page_size
        return (F - 1) // ps if self.mtp_on and F > 0 else F // ps

    def checkpoint_info(self, checkpoint_id: int) -> CheckpointInfo:
        return self._ckpt(checkpoint_id).info

    def checkpoint_tokens(self, checkpoint_id: int) -> tuple[int, ...]:
        return self._ckpt(checkpoint_id).tokens

    def cache_usage(self) -> CacheUsage:
        dev = [c for c in self._ckpts.values() if c.holding.on_device]
        host = [c for c in self._ckpts.values() if not c.holding.on_device]
        return CacheUsage(len(dev), len(host),
                          len(dev) * self._slot_bytes + self._ledger.inactive_pages() * self._page_bytes,
                          sum(c.info.nbytes for c in host))

    def _ckpt(self, checkpoint_id: int) -> _Checkpoint:
        c = self._ckpts.get(checkpoint_id)
        if c is None:
            raise InvariantError(f"unknown checkpoint {checkpoint_id}")
        return c

    def _require_fresh(self, plan: ResourcePlan) -> None:
        if plan.resource_revision != self._ledger.revision:
            raise StalePlanError(f"plan {plan.plan_id} sealed at revision {plan.resource_revision}, "
                                 f"now {self._ledger.revision}")

    def _nbytes(self, frontier: int) -> int:
        return self._slot_bytes + pages_for(frontier, self.config.page_size) * self._page_bytes

    # ---- materialization from a source ---------------------------------------------------
    def _plan_from(self, request: SequenceRequest, source: int | None, evictable: Sequence[int],
                   host_bytes_free: int) -> ResourcePlan | Refusal:
        growth = self._growth(request)
        why = self._ledger.refusal(growth, request.publication)
        if why is not None and why.kind is RefusalKind.INFEASIBLE:
            return why
        shared, reused = 0, 0
        if source is not None:
            c = self._ckpt(source)
            F = c.info.frontier
            if request.prompt_logprobs is not None:
                raise InvariantError("a request asking for prompt log-probs must be computed from root")
            if not (1 <= F < len(request.prompt_token_ids)) or request.identity_prompt()[:F] != c.tokens:
                raise InvariantError(f"checkpoint {source} (frontier {F}) does not prove a strict prefix "
                                     f"of the prompt ({len(request.prompt_token_ids)} tokens)")
            shared = self._shared_pages(F) if c.holding.on_device else 0
            reused = F
        need = self._ledger.need(growth, request.publication, shared)
        keep = () if source is None else (source,)
        victims = self._ledger.victims(need, evictable, keep)
        if victims is None:
            short = self._ledger.refusal(growth, request.publication, shared)
            return Refusal(RefusalKind.SHORT_NOW, (short.reason if short else "short") +
                           (" (with every offered inactive checkpoint released)" if evictable else ""))
        offload = []
        for v in victims:
            n = self._ckpt(v).info.nbytes
            if n <= host_bytes_free:
                offload.append(v)
                host_bytes_free -= n
        return ResourcePlan(plan_id=next(self._plan_ids), resource_revision=self._ledger.revision,
                            request=request, pages=need.pages, slots=need.slots, num_reused_tokens=reused,
                            source=source, victims=tuple(victims), offload=tuple(offload))

    def _evict(self, plan: ResourcePlan) -> tuple[tuple[int, ...], tuple[int, ...]]:
        evicted, offloaded = [], []
        for v in plan.victims:
            if v in plan.offload:
                self._offload(v)
                offloaded.append(v)
            else:
                self._delete(v)
                evicted.append(v)
        return tuple(evicted), tuple(offloaded)

    def _start_from(self, plan: ResourcePlan, seq_id: int) -> tuple[object, tuple[int, ...], tuple[int, ...]]:
        """Acquire the holding of a new sequence from plan.source (None: root); copy the state in."""
        src = self._ckpt(plan.source) if plan.source is not None else None
        if src is not None:
            self._ledger.pin(plan.source)
        try:
            evicted, offloaded = self._evict(plan)
            ps = self.config.page_size
            shared = ()
            if src is not None and src.holding.on_device:
                shared = src.holding.pages[: self._shared_pages(src.info.frontier)]
            holding = self._ledger.acquire(seq_id, self._growth(plan.request), publication=plan.request.publication,
                                           shared_pages=shared)
            if src is None:
                self._state.zero_entry(holding.slot)
            elif src.holding.on_device:
                self._state.copy_entry(holding.slot, src.holding.slot)
                F = src.info.frontier
                n = len(shared)
                if n * ps < F:
                    # NOTE: copy-on-write of the last page of the prefix (partial, or the one the MTP layer's
                    #       first write goes to): the continuation gets its own copy.
                    new = holding.table.ensure(F)
                    if len(new) != 1:
                        raise InvariantError(f"last page copy mapped {len(new)} pages")
                    self._kv.k[:, new[0]].copy_(self._kv.k[:, src.holding.pages[n]])
                    self._kv.v[:, new[0]].copy_(self._kv.v[:, src.holding.pages[n]])
            else:
                new = holding.table.ensure(src.info.frontier)
                idx = torch.tensor(new, dtype=torch.long, device=self.device)
                self._kv.k.index_copy_(1, idx, src.host["k"].to(self.device))
                self._kv.v.index_copy_(1, idx, src.host["v"].to(self.device))
                for name in self._state.planes:
                    self._state.image(name, holding.slot).copy_(src.host[name])
        finally:
            if src is not None:
                self._ledger.unpin(plan.source)
        return holding, evicted, offloaded

    # ---- capture of a live sequence ------------------------------------------------------
    def plan_capture(self, seq: SequenceHandle, evictable: Sequence[int] = ()) -> ResourcePlan | Refusal:
        s = self._seq(seq)
        self._pending.require_idle(s.handle.seq_id, "capture")
        self.step_ahead.discard(s.handle.seq_id)
        if s.frontier < 1:
            return Refusal(RefusalKind.INFEASIBLE, "nothing to capture at frontier 0")
        victims = self._ledger.victims(self._ledger.need(0), evictable)
        if victims is None:
            return Refusal(RefusalKind.SHORT_NOW, "no StateImage slot for a checkpoint")
        return ResourcePlan(plan_id=next(self._plan_ids), resource_revision=self._ledger.revision,
                            request=s.request, pages=0, slots=1, num_reused_tokens=0, kind="capture",
                            victims=tuple(victims), sequence=s.handle)

    def start_capture(self, plan: ResourcePlan) -> ResourceResult:
        self._require_fresh(plan)
        if plan.kind != "capture" or plan.sequence is None:
            raise InvariantError(f"plan {plan.plan_id} is not a capture plan")
        s = self._seq(plan.sequence)
        evicted, offloaded = self._evict(plan)
        cid = next(self._ckpt_ids)
        holding = self._ledger.capture(s.handle.seq_id, cid, s.frontier)
        self._state.copy_entry(holding.slot, s.slot)
        info = self._publish(holding, self.identity_tokens(s, s.frontier), "capture", s)
        return ResourceResult(ok=True, resource_revision=self._ledger.revision, checkpoint=info,
                              evicted=evicted, offloaded=offloaded)

    def _publish(self, holding: CheckpointHolding, tokens: tuple[int, ...], kind: str, s) -> CheckpointInfo:
        info = CheckpointInfo(holding.checkpoint_id, holding.frontier, prefix_digest(tokens), Placement.DEVICE,
                              self._nbytes(holding.frontier),
                              Provenance(kind, s.handle.seq_id, s.source, self._ledger.revision))
        self._ckpts[holding.checkpoint_id] = _Checkpoint(info, tokens, holding)
        return info

    # ---- the publication slot ------------------------------------------------------------
    def _pub_target_reached(self, s, entry_of) -> None:
        """Copy the state at s.pub_target into the publication slot if `entry_of(T)` has it."""
        T = s.pub_target
        if T is None or s.holding.pub_slot is None or T == s.pub_frontier:
            return
        entry = entry_of(T)
        if entry is not None:
            self._state.copy_entry(s.holding.pub_slot, entry)
            s.pub_frontier = T

    def _set_pub_target(self, s, T: int) -> None:
        if s.holding.pub_slot is None:
            return
        if s.pub_target is None or T > s.pub_target:
            s.pub_target = T

    def _note_commit(self, s, rec, r: int, accepted: int, f0: int, kind_prefill: bool,
                     boundary: int | None) -> None:
        """After committing `accepted` tokens of row r (frontier f0 -> s.frontier)."""
        if s.holding.pub_slot is None:
            return
        f1 = s.frontier
        if boundary is not None:
            if not (0 <= boundary <= accepted):
                raise InvariantError(f"boundary {boundary} outside the accepted span of {accepted}")
            # NOTE: boundary counts accepted tokens of this span; the span starts after the tokens
            # the sequence held before (the prompt, or everything up to the last sampled token).
            self._set_pub_target(s, len(s.tokens) - accepted + boundary)

        def entry_of(T: int) -> int | None:
            if not (f0 < T <= f1):
                return None
            if kind_prefill:
                return self._state.scratch_entry(rec.scratch[r][0]) if T == f1 else None
            return self._state.scratch_entry(rec.scratch[r][T - f0 - 1])
        self._pub_target_reached(s, entry_of)

    # ---- terminal ------------------------------------------------------------------------
    def retain(self, seq: SequenceHandle) -> ResourceResult:
        """Publish one complete checkpoint from a terminal sequence, or release it."""
        s = self._seq(seq)
        self._pending.require_idle(s.handle.seq_id, "retain")
        self.step_ahead.discard(s.handle.seq_id)
        h = s.holding
        if h.pub_slot is not None and s.pub_target == s.frontier + 1 and s.pub_frontier != s.pub_target:
            # NOTE: the target covers the last sampled token, which is not in the state yet: one more
            # token step, into the publication slot only (the KV lands in the sequence's own page).
            self._state.copy_entry(h.pub_slot, s.slot)
            hidden = self._forward([s], [[s.tokens[s.frontier]]], [s.frontier], [h.pub_slot])
            if self.mtp_on:
                self.mtp_observe_step([s], [s.tokens[s.frontier]], [s.frontier], [s.slot], [h.pub_slot], hidden)
            s.pub_frontier = s.pub_target
        if h.pub_slot is not None and s.pub_frontier is not None:
            frontier, use_pub = s.pub_frontier, True
        elif s.request.reconstruction_prefix is None and s.frontier >= 1:
            frontier, use_pub = s.frontier, False
        else:
            return self.release(seq)
        cid = next(self._ckpt_ids)
        holding, _ = self._ledger.retain(s.handle.seq_id, cid, frontier, use_pub)
        self._seqs.remove(s.handle.seq_id)
        info = self._publish(holding, self.identity_tokens(s, frontier), "terminal", s)
        return ResourceResult(ok=True, resource_revision=self._ledger.revision, checkpoint=info)

    # ---- placement and deletion ------------------------------------------------------------
    def _delete(self, checkpoint_id: int) -> None:
        self._ckpt(checkpoint_id)
        self._ledger.delete_checkpoint(checkpoint_id)
        del self._ckpts[checkpoint_id]

    def _offload(self, checkpoint_id: int) -> None:
        c = self._ckpt(checkpoint_id)
        h = c.holding
        if not h.on_device:
            raise InvariantError(f"checkpoint {checkpoint_id} is already a host replica")
        idx = torch.tensor(h.pages, dtype=torch.long, device=self.device)
        host = {"k": self._kv.k.index_select(1, idx).to("cpu"), "v": self._kv.v.index_select(1, idx).to("cpu")}
        for name in self._state.planes:
            host[name] = self._state.image(name, h.slot).to("cpu", copy=True)
        self._ledger.offload(checkpoint_id)
        c.host = host
        c.info = replace(c.info, placement=Placement.HOST)

    def delete_checkpoint(self, checkpoint_id: int) -> ResourceResult:
        self._delete(checkpoint_id)
        return ResourceResult(ok=True, resource_revision=self._ledger.revision, evicted=(checkpoint_id,))

    def offload_checkpoint(self, checkpoint_id: int) -> ResourceResult:
        self._offload(checkpoint_id)
        return ResourceResult(ok=True, resource_revision=self._ledger.revision, offloaded=(checkpoint_id,))

    # ---- integrity -------------------------------------------------------------------------
    def _check_checkpoints(self) -> None:
        ledger_ids = {c.checkpoint_id for c in self._ledger.checkpoints}
        if ledger_ids != set(self._ckpts):
            raise InvariantError(f"checkpoints {sorted(self._ckpts)} but the ledger holds {sorted(ledger_ids)}")
        for cid, c in self._ckpts.items():
            if self._ledger.checkpoint(cid) is not c.holding or c.holding.pins:
                raise InvariantError(f"checkpoint {cid}: ledger record differs or is left pinned")
            if len(c.tokens) != c.info.frontier or c.holding.frontier != c.info.frontier:
                raise InvariantError(f"checkpoint {cid}: {len(c.tokens)} tokens for frontier {c.info.frontier}")
            if prefix_digest(c.tokens) != c.info.digest:
                raise InvariantError(f"checkpoint {cid}: digest does not match its tokens")
            on_host = c.info.placement is Placement.HOST
            if on_host == c.holding.on_device or on_host != (c.host is not None):
                raise InvariantError(f"checkpoint {cid}: placement {c.info.placement.value} inconsistent")
        for s in self._seqs:
            if s.pub_frontier is not None and (s.holding.pub_slot is None or s.pub_frontier > s.frontier + 1):
                raise InvariantError(f"sequence {s.handle.seq_id}: publication frontier {s.pub_frontier} "
                                     f"without a slot or beyond its state")
