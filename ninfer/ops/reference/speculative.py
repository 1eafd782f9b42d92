"""Lossless verification of a speculative round: how many drafts each row keeps, and the target's token after them.

A round verifies the block [last token, d_1, ..., d_K] of each row in one target forward: logits[b, j]
is the target's distribution for the token after position j, so it judges d_{j+1} = drafts[b, j]. The
drafter proposes point masses (its argmax), q_j = one-hot(d_j), and the rule is speculative sampling
with a point-mass proposal ("greedy draft + sampling target", speculative.md §4.2):

  greedy rows (temperature <= 0): t_j = argmax of the penalized logits at j (`sample`'s greedy rule,
      ties to the lowest id); accept d_{j+1} while d_{j+1} == t_j; emit t_a at the first mismatch a
      (a = K when every draft is accepted).
  sampled rows: p_j = `sample`'s distribution at j (penalties, temperature, top-k, top-p, min-p, built
      from the same functions); accept d_{j+1} iff u_j < p_j(d_{j+1}), u_j ~ U[0, 1); at the first
      rejection a, emit a draw from p_a with d_{a+1}'s mass removed, renormalized (max(0, p_a - q_a));
      when all K are accepted, a draw from p_K.

Why it is exact: for a draft d chosen without looking at u_j, the token kept or drawn at j is x with
probability p(d)·[x = d] + (1 - p(d))·p(x)·[x != d] / (1 - p(d)) = p_j(x), and position j + 1 is judged
only after d was kept, with the logits of the prefix that now holds it. So the emitted tokens follow the
same law as K + 1 steps of `sample`. A draft outside the kept set (p = 0) is always rejected; p(d) = 1
is always accepted, so the residual is never empty.

Draws use `sample`'s convention: argmax p / Exp(1) over the tokens with p > 0 (an exact sample of p).
Random stream of a drawn row with a generator state: `torch.rand(K)`, then one Exp(1) noise row of length
V, both from that generator; the returned state is the one after both. With K = 0 this is exactly one
`sample` step (same state, same token, same next state). Rows whose state is None draw from the device's
default generator (all such rows at once: their uniforms, then their noise rows) and keep None. Greedy
rows never touch their state. States are device-specific, as in `sampling`.

`force_accept` = L (1..K+1) is a benchmarking aid: every row keeps exactly L - 1 drafts whatever the
target says and emits the target's token at position L - 1 (its argmax for greedy rows, a draw from the
whole p_{L-1} for sampled rows); the random stream is consumed as without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ninfer.ops.reference.sampling import SamplingTensors, _truncate, apply_penalties

__all__ = ["VerifyResult", "verify_drafts"]


class VerifyResult(NamedTuple):
    num_accepted: torch.Tensor          # [B] int64: accepted drafts, 0..K
    tokens: torch.Tensor                # [B, T] int64: row b emits tokens[b, :num_accepted[b] + 1]
                                        #   (its accepted drafts, then the target's token); the rest is unspecified
    rng_states: list                    # [B] advanced generator states (greedy rows: unchanged)


def _random_draws(B: int, K: int, V: int, drawn: Sequence[int], rng_states: Sequence[torch.Tensor | None],
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The uniforms u [B, K] and Exp(1) noise [B, V] of the drawn rows (other rows: u 0, noise 1), and the
    advanced states."""
    mixed = len(drawn) < B
    u = torch.zeros(B, K, device=device)
    noise = (torch.ones if mixed else torch.empty)(B, V, device=device)
    states = list(rng_states)
    unseeded = []
    for b in drawn:
        if rng_states[b] is None:
            unseeded.append(b)
            continue
        gen = torch.Generator(device=device)
        gen.set_state(rng_states[b])
        u[b] = torch.rand(K, generator=gen, device=device)
        noise[b].exponential_(generator=gen)
        states[b] = gen.get_state()
    if unseeded:
        n = len(unseeded)
        if n == B:
            u = torch.rand(B, K, device=device)
            noise.exponential_()
        else:
            idx = torch.tensor(unseeded, dtype=torch.long).to(device)
            u[idx] = torch.rand(n, K, device=device)
            noise[idx] = torch.empty(n, V, device=device).exponential_()
    return u, noise, states


def verify_drafts(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    st: SamplingTensors,
    rng_states: Sequence[torch.Tensor | None],
    *,
    drawn: Sequence[int] | None = None,
    force_accept: int = 0,
) -> VerifyResult:
    """Accept a prefix of each row's drafts and pick the target's token after it.

    Args:
        logits: [B, T, V] any float dtype, T = K + 1; logits[b, j] is the target's distribution for the
            token after position j of the verified block [last token, d_1, ..., d_K].
        drafts: [B, K] int64, drafts[b, j] = d_{j+1} (judged by logits[b, j]).
        st: sampling parameters of B * T rows, row b * T + j = position j of row b (its output history
            holding drafts[b, :j]); the positions of a row share its temperature.
        rng_states: B generator states (see the module docstring) or None entries.
        drawn: the rows b with temperature > 0 as a host list (`sampling.drawing_rows` of the rows'
            temperatures); None computes them from st (a device read).
        force_accept: 0 (off) or L in 1..T: every row keeps L - 1 drafts and emits the target's token at L - 1.
    Returns:
        VerifyResult (accepted counts, emitted tokens, advanced rng states).
    """
    if logits.dim() != 3 or logits.shape[1] < 1:
        raise ValueError(f"logits must be [B, T, V] with T >= 1, got {tuple(logits.shape)}")
    B, T, V = logits.shape
    K = T - 1
    if tuple(drafts.shape) != (B, K):
        raise ValueError(f"drafts {tuple(drafts.shape)} do not match logits {tuple(logits.shape)}: expected ({B}, {K})")
    if V != st.vocab_size or st.temperature.shape[0] != B * T or len(rng_states) != B:
        raise ValueError(f"logits {tuple(logits.shape)} do not match {st.temperature.shape[0]} sampling rows "
                         f"(B * T = {B * T}) of vocabulary {st.vocab_size} with {len(rng_states)} rng states")
    if not 0 <= force_accept <= T:
        raise ValueError(f"force_accept must be 0 (off) or 1..{T} (T = K + 1), got {force_accept}")
    device = logits.device
    drafts = drafts.to(device=device, dtype=torch.long)
    x = apply_penalties(logits.reshape(B * T, V), st)
    greedy = st.temperature.view(B, T)[:, 0] <= 0
    if drawn is None:
        drawn = torch.nonzero(~greedy).flatten().tolist()
    target = x.argmax(dim=-1).view(B, T)
    accept = drafts == target[:, :K]
    states: list = list(rng_states)
    if drawn:
        temp = torch.where(st.temperature <= 0, torch.ones_like(st.temperature), st.temperature)
        p = torch.softmax(_truncate(x / temp[:, None], st), dim=-1).view(B, T, V)
        u, noise, states = _random_draws(B, K, V, drawn, rng_states, device)
        p_draft = p[:, :K].gather(2, drafts[:, :, None])[:, :, 0]
        accept = torch.where(greedy[:, None], accept, u < p_draft)
    if force_accept:
        a = torch.full((B,), force_accept - 1, dtype=torch.long, device=device)
    else:
        # NOTE: the accepted prefix: drafts up to the first rejection
        a = accept.long().cumprod(dim=1).sum(dim=1)
    last = target.gather(1, a[:, None])[:, 0]
    if drawn:
        pa = p[torch.arange(B, device=device), a]
        if not force_accept:
            # NOTE: the rejected draft d_{a+1} leaves the race (a = K: none was rejected, the -1 matches no id)
            rejected = torch.cat([drafts, drafts.new_full((B, 1), -1)], dim=1).gather(1, a[:, None])
            pa = pa.masked_fill(torch.arange(V, device=device)[None, :] == rejected, 0.0)
        # NOTE: removed tokens (p = 0) must never win, even against a zero noise draw.
        drawn_token = torch.where(pa > 0, pa / noise.clamp_min(1e-30), -1.0).argmax(dim=-1)
        last = torch.where(greedy, last, drawn_token)
    tokens = torch.cat([drafts, last[:, None]], dim=1).scatter(1, a[:, None], last[:, None])
    return VerifyResult(a, tokens, states)
