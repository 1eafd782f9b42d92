"""What the serve warmup runs so that no request waits for a first-use compile, capture or plan.

On the fast ops, Triton compiles a kernel again for each specialisation of its integer arguments (== 1,
divisible by 16), and the prefill kernels take token and pair counts; the chunk-GDN graphs and the
prefill graphs are captured per bucket; cuDNN's SDPA plans are made per padded length (`sdpa_rows`).
The warmup therefore runs one prompt of each length `warmup_lengths` names, then plans the attention
of prompts longer than one stage (`plan_attention`). The reference ops have nothing to compile.
"""
from __future__ import annotations

from ninfer.ops.reference.attention import sdpa_rows

# NOTE: odd and even row counts of the GEMV (<= 8 rows) and just past it; the first use of each cost
#       a compile on a fresh server (docs/performance.md, "Decision log").
WARMUP_SMALL = (2, 5, 9, 12)
# NOTE: the warmup's time for the cuDNN plans of prompts longer than one stage; shortest contexts first,
#       so a long max_model_len plans what fits and leaves the longest contexts' shapes to their first use
#       (docs/performance.md, "Decision log").
PREFIX_PLAN_BUDGET_S = 20.0


def warmup_lengths(stage_tokens: int, max_model_len: int, buckets, graph_max_tokens: int,
                   stage_buckets=()) -> list[int]:
    """`Program.warmup_prompt_lengths` on the fast ops, every one at most the stage size and
    max_model_len - 2 (prompt + the warmup's 2 output tokens): WARMUP_SMALL; each graphed chunk-GDN
    length (buckets up to graph_max_tokens; their first capture, compile and autotuning); each
    prefill-graph bucket (stage_buckets: the whole-stage graphs' captures, prefill_graphs.py); one less
    than each padded attention length (`ninfer.ops.reference.attention.sdpa_rows`: its plan, and odd token
    counts); the full stage and one less. A warmup request runs with the context cache off, so its
    prompt is one prefill stage of exactly its length."""
    stage = min(stage_tokens, max_model_len - 2)
    if stage < 1:
        return []
    out = ({n for n in WARMUP_SMALL if n <= stage} | {b for b in buckets if b <= min(graph_max_tokens, stage)}
           | {b for b in stage_buckets if b <= stage})
    # NOTE: past the prefill graphs the padded lengths themselves too: the eager stages' even (divisible by
    #       16) specialisations, which a graphed stage does not compile.
    graphed = max(stage_buckets, default=0)
    r = sdpa_rows(1)
    while r <= stage:
        out.add(r - 1)
        if r > graphed and stage_buckets:
            out.add(r)
        r = sdpa_rows(r + 1)
    out |= {stage, stage - 1} - {0}
    return sorted(out)


def plan_attention(dims, dtype, device, stage_tokens: int, max_model_len: int, budget_s: float) -> tuple[int, int]:
    """Plan the cuDNN attention calls of prompts longer than one stage, up to max_model_len - 1 tokens
    (`warm_prefix_forms` over `prefix_plan_shapes`), starting no new shape after budget_s seconds.
    Returns (shapes run, shapes in all)."""
    from ninfer.ops.reference import prefix_routing
    from ninfer.ops.triton import attention
    shapes = prefix_routing.prefix_plan_shapes(dims.num_attention_heads, dims.head_dim, stage_tokens,
                                               max_model_len - 1)
    n = attention.warm_prefix_forms(shapes, dims.num_attention_heads, dims.num_key_value_heads, dims.head_dim,
                                    dtype, device, budget_s)
    return n, len(shapes)
