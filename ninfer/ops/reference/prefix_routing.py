"""How a prompt chunk's attention over its earlier tokens runs on the fast ops, and which cuDNN call
shapes a long prompt meets (`ninfer.ops.triton.attention.attend_over_prefix` runs the forms; the serve
warmup plans the shapes: `ninfer.ops.triton.attention.warm_prefix_forms`). Plain Python, no Triton: the
routing is tested on the CPU."""
from __future__ import annotations

from ninfer.ops.reference.attention import sdpa_rows

# NOTE: a long chunk over a long prefix (a long prompt's later stages) runs through cuDNN instead of flash:
#       cuDNN's kernels run this much faster than PyTorch's flash kernel with the lower-right mask
#       (docs/performance.md, "Decision log"). cuDNN has no lower-right mask, so the chunk runs twice
#       (`split_prefix_sdpa`) and the halves merge by their log-sum-exps. Each new cuDNN shape builds a plan on
#       first use, so the shapes are bucketed and the split runs only where a call's attention is large
#       enough that its first use costs about what it then saves per request: SPLIT_MIN_FLOPS. The serve
#       warmup plans the shapes of uncached prompts (`prefix_plan_shapes`).
SPLIT_MIN_FLOPS = 1e12
SPLIT_GRAIN = 2048          # the prefix's keys of the non-causal call: a multiple of this many
cudnn_split_ok = True       # False after the cuDNN op failed once (warned): flash from then on


# NOTE: a chunk over a prefix shorter than about itself (a context-cache hit on a system prompt followed by a
#       long message; a prompt a little over one stage) is cheapest as one causal self-attention over the
#       whole context with the prefix's query rows zero (`front_padded_sdpa`): cuDNN's causal kernel at a
#       padded length, doing at most PAD_MAX_WORK times the chunk's own work (docs/performance.md,
#       "Decision log").
PAD_MAX_WORK = 1.6


def pad_work_ok(L: int, C: int) -> bool:
    """front_padded_sdpa for L new tokens over a C-token context does at most PAD_MAX_WORK times the
    chunk's own work (L(P + L/2))."""
    S = sdpa_rows(C)
    return S * (S + 1) / 2 <= PAD_MAX_WORK * L * (C - L + (L + 1) / 2)


def prefix_form(heads: int, head_dim: int, L: int, C: int, cudnn: bool = True) -> str:
    """How `attend_over_prefix` runs L new tokens over a C-token context (heads query heads of head_dim):
    "self" (no prefix: `padded_causal_sdpa`), "pad" (`front_padded_sdpa`), "split" (`split_prefix_sdpa`)
    or "flash" (`lower_right_sdpa`). cudnn: the query's device and dtype suit cuDNN."""
    if L == C:
        return "self"
    if cudnn and pad_work_ok(L, C):
        return "pad"
    if cudnn and cudnn_split_ok and 4.0 * heads * head_dim * L * (C - L / 2) >= SPLIT_MIN_FLOPS:
        return "split"
    return "flash"


def split_bounds(L: int, C: int) -> tuple[int, int]:
    """(P0, rem) of the split: the prefix's P = C - L keys as P0 (a multiple of SPLIT_GRAIN, the
    non-causal call's keys) + rem (zero query rows in front of the causal call's)."""
    P = C - L
    P0 = P // SPLIT_GRAIN * SPLIT_GRAIN
    return P0, P - P0


def cudnn_calls(heads: int, head_dim: int, L: int, C: int) -> tuple:
    """The cuDNN calls `attend_over_prefix` makes for L new tokens over a C-token context (C > L), each
    named by what its execution plan is keyed on: ("causal", rows) for `padded_causal_sdpa` (through
    F.scaled_dot_product_attention, no log-sum-exp), ("cross", query rows, keys) and ("causal_lse", rows)
    for the split's two calls. () where flash runs."""
    form = prefix_form(heads, head_dim, L, C)
    P0, rem = split_bounds(L, C)
    if form == "pad" or (form == "split" and P0 == 0):
        return (("causal", sdpa_rows(C)),)
    if form != "split":
        return ()
    return ("cross", sdpa_rows(L), P0), ("causal_lse", sdpa_rows(rem + L))


def prefix_plan_shapes(heads: int, head_dim: int, stage: int, max_prompt: int) -> list[tuple[int, int]]:
    """(L, C) stage shapes that together make every cuDNN call whose plan a prompt of at most max_prompt
    tokens meets in `stage`-token stages after its first (no context-cache hit: its stages start at
    multiples of `stage`), in the order of their contexts: each pair brings at least one call shape no
    earlier pair made (`cudnn_calls`)."""
    seen: set = set()
    out = []
    for P in range(stage, max_prompt, stage):
        for L in range(1, min(stage, max_prompt - P) + 1):
            calls = cudnn_calls(heads, head_dim, L, P + L)
            if any(c not in seen for c in calls):
                seen.update(calls)
                out.append((L, P + L))
    return out
