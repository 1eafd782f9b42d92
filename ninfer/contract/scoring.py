"""Contract of the CausalScoring purpose between Engine (`CausalScoreCore`) and Program.

Engine plans the windows of a text (the sliding-window recipe, see `causal_score_core.py`) and
hands Program one window at a time. Program runs it over a temporary empty State and Main KV
that belong to no sequence (they are not part of the Generation pools), and returns the log-probs
of the window's scored tokens as host values. Nothing persists from one window to the next.

    window.token_ids   t0 t1 ... t[first_scored-1] | t[first_scored] ... t[n-1]
                       context only (not scored)   | scored: log p(t_j | t_0 .. t_{j-1}) for j >= first_scored
"""
from __future__ import annotations

from typing import NamedTuple, Protocol


class ScoringWindow(NamedTuple):
    token_ids: tuple[int, ...]       # fed at positions 0 .. n-1 over an empty state
    first_scored: int                # 1 <= first_scored < n (token 0 has no context and is never scored)
    top_k: int = 0                   # alternatives per scored token (0..20)


class WindowScores(NamedTuple):
    """One entry per scored token j = first_scored .. n-1 (raw model distribution, fp32 log_softmax)."""
    token_logprobs: tuple[float, ...]
    ranks: tuple[int, ...]                            # 1 + number of tokens with a larger log-prob
    top: tuple[tuple[tuple[int, float], ...], ...]    # (token_id, logprob) best first; () per token when top_k == 0


class CausalScoringProgram(Protocol):
    """The part of a Program a CausalScoring engine uses (only a Program built for that purpose)."""

    @property
    def scoring_window(self) -> int: ...          # the longest window (tokens) the staging holds

    def score_window(self, window: ScoringWindow) -> WindowScores: ...
