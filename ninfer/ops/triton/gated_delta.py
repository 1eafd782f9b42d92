"""Fast gated delta rule (CUDA): chunked prefill through fla-core, recurrent decode in Triton.

Same arguments, state convention and results as `ninfer.ops.reference.gated_delta` (the oracle), plus
`gather_final_state`: with a slot pool (`state_indices` given) the final state is written in
place, and the [N, Hv, K, V] copy returned by the reference is only gathered when asked for
(the Program never reads it, and at decode the gather would cost as much as the kernel).

    chunk_gated_delta_rule            q, k [B, T, Hk, K], v [B, T, Hv, V], g, beta [B, T, Hv]
                                      (or B = 1 with cu_seqlens [N+1]); state [S|N, Hv, K, V] fp32
    fused_recurrent_gated_delta_rule  same shapes; meant for T = 1 (or a few speculative tokens)

NOTE: fla-core is imported lazily, on the first call, so the CPU install never needs it.

Short prefill stages of one sequence (T <= GRAPH_MAX_TOKENS) replay a CUDA graph of fla-core's chunk
forward captured at a padded length instead of calling it: its Python launch path (an autograd
Function, input guards, several Triton launches through fla's autotuner) costs host time per call
that rivals a short stage's GPU work (docs/performance.md, "Decision log"). The inputs are copied into the graph's static buffers, the padding tokens
get q = k = v = 0, g = 0, beta = 0: they neither decay nor update the state, and (causal) no real
token reads them, so the outputs and the final state are those of the T real tokens.
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import warnings
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.ops.reference import gated_delta as _ref
from ninfer.ops.triton.common import device_index

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "fla_available"]

FLA_VERSION = "0.6.0"


@functools.cache
def fla_available() -> bool:
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


def _pool_and_indices(initial_state, state_indices, N, Hv, K, V, device):
    """-> (fp32 pool the kernel reads and updates in place, int32 row indices, is_slot_pool)."""
    if initial_state is None:
        pool = torch.zeros(N, Hv, K, V, dtype=torch.float32, device=device)
        return pool, torch.arange(N, dtype=torch.int32, device=device), False
    if state_indices is None:
        if tuple(initial_state.shape) != (N, Hv, K, V):
            raise ValueError(f"state has shape {tuple(initial_state.shape)}, expected {(N, Hv, K, V)}")
        pool = initial_state.to(torch.float32, copy=True).contiguous()
        return pool, torch.arange(N, dtype=torch.int32, device=device), False
    return initial_state, device_index(state_indices, device), True


def _finish(initial_state, state_indices, pool, idx, is_slot, output_final_state, gather_final_state):
    if not output_final_state:
        return None
    if is_slot:
        return pool.index_select(0, idx.long()) if gather_final_state else None
    return pool if initial_state is None or initial_state.dtype == torch.float32 else pool.to(initial_state.dtype)


# ----------------------------------------------------------------------------------------------
# Recurrent form (decode)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _fused_recurrent_gdn_kernel(
    q, k, v, g, beta, o, state, idx, didx, cu, scale, T,
    stride_q, stride_k, stride_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_L2: tl.constexpr, VARLEN: tl.constexpr, WRITE_STATE: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    if VARLEN:
        bos = tl.load(cu + i_n).to(tl.int64)
        eos = tl.load(cu + i_n + 1).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    slot = tl.load(idx + i_n).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mk = o_k < K
    mv = o_v < V
    ms = mk[:, None] & mv[None, :]
    p_s = state + slot * (HV * K * V) + i_hv * (K * V) + o_k[:, None] * V + o_v[None, :]
    S = tl.load(p_s, mask=ms, other=0.0).to(tl.float32)
    for t in range(bos, eos):
        bq = tl.load(q + t * stride_q + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
        bk = tl.load(k + t * stride_k + i_h * K + o_k, mask=mk, other=0.0).to(tl.float32)
        bv = tl.load(v + t * stride_v + i_hv * V + o_v, mask=mv, other=0.0).to(tl.float32)
        bg = tl.load(g + t * HV + i_hv).to(tl.float32)
        bb = tl.load(beta + t * HV + i_hv).to(tl.float32)
        if USE_L2:
            bq = bq * tl.rsqrt(tl.sum(bq * bq) + 1e-6)
            bk = bk * tl.rsqrt(tl.sum(bk * bk) + 1e-6)
        bq = bq * scale
        S = S * tl.exp(bg)
        kv = tl.sum(S * bk[:, None], 0)
        delta = (bv - kv) * bb
        S = S + bk[:, None] * delta[None, :]
        bo = tl.sum(S * bq[:, None], 0)
        tl.store(o + t * (HV * V) + i_hv * V + o_v, bo.to(o.dtype.element_ty), mask=mv)
    if WRITE_STATE:
        # NOTE: written at didx (= idx unless a separate destination entry is given).
        dslot = tl.load(didx + i_n).to(tl.int64)
        p_d = state + dslot * (HV * K * V) + i_hv * (K * V) + o_k[:, None] * V + o_v[None, :]
        tl.store(p_d, S.to(state.dtype.element_ty), mask=ms)


def _token_stride(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x [B, T, H, D] -> (x with contiguous heads, elements between consecutive flattened tokens)."""
    B, T, H, D = x.shape
    if x.stride(3) != 1 or x.stride(2) != D:
        x = x.contiguous()
    if T == 1:
        return x, x.stride(0)
    if B == 1 or x.stride(0) == T * x.stride(1):
        return x, x.stride(1)
    return x.contiguous(), H * D


def fused_recurrent_gated_delta_rule(
    q, k, v, g, beta, *, scale=None, initial_state=None, state_indices=None, output_final_state=True,
    use_qk_l2norm_in_kernel=False, cu_seqlens=None, gather_final_state=True, dst_indices=None,
):
    """Decode form; see the module docstring and `ninfer.ops.reference.gated_delta.fused_recurrent_gated_delta_rule`
    (incl. `dst_indices`: read the state at `state_indices`, write it at `dst_indices`, in the kernel)."""
    B, T, Hk, K = k.shape
    Hv, V = v.shape[2], v.shape[3]
    pool_ok = initial_state is None or state_indices is None or (
        initial_state.dtype == torch.float32 and initial_state.is_contiguous())
    if dst_indices is not None and (state_indices is None or not pool_ok or not output_final_state):
        initial_state.index_copy_(0, dst_indices.long(), initial_state.index_select(0, state_indices.long()))
        state_indices, dst_indices = dst_indices, None
    if Hv % Hk or q.shape[2] != Hk or K > 256 or not pool_ok:
        return _ref.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, state_indices=state_indices,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            cu_seqlens=cu_seqlens, dst_indices=dst_indices)
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"with cu_seqlens the batch dimension must be 1, got {B}")
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    pool, idx, is_slot = _pool_and_indices(initial_state, state_indices, N, Hv, K, V, q.device)
    q, sq = _token_stride(q)
    k, sk = _token_stride(k)
    v, sv = _token_stride(v)
    g = g.contiguous()
    beta = beta.contiguous()
    o = torch.empty(B, T, Hv, V, dtype=q.dtype, device=q.device)
    BK = triton.next_power_of_2(K)
    BV = min(32, triton.next_power_of_2(V))
    grid = (N, Hv, triton.cdiv(V, BV))
    didx = idx if dst_indices is None else device_index(dst_indices, q.device)
    _fused_recurrent_gdn_kernel[grid](
        q, k, v, g, beta, o, pool, idx, didx, cu_seqlens if cu_seqlens is not None else idx,
        float(scale if scale is not None else K ** -0.5), T, sq, sk, sv,
        H=Hk, HV=Hv, K=K, V=V, BK=BK, BV=BV, USE_L2=bool(use_qk_l2norm_in_kernel),
        VARLEN=cu_seqlens is not None, WRITE_STATE=bool(output_final_state), num_warps=4)
    return o, _finish(initial_state, state_indices, pool, didx, is_slot, output_final_state, gather_final_state)


# ----------------------------------------------------------------------------------------------
# Chunked form (prefill) through fla-core
# ----------------------------------------------------------------------------------------------
def chunk_gated_delta_rule(
    q, k, v, g, beta, *, scale=None, initial_state=None, state_indices=None, output_final_state=True,
    use_qk_l2norm_in_kernel=False, cu_seqlens=None, chunk_size=64, gather_final_state=True,
):
    """Prefill form via fla-core's `chunk_gated_delta_rule` (GVA: Hv a multiple of Hk, consecutive
    grouping as the model). Initial states are gathered from the slots and final states scattered
    back into them. Falls back to the reference when fla-core is missing."""
    if not fla_available() or chunk_size not in (16, 32, 64):
        return _ref.chunk_gated_delta_rule(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, state_indices=state_indices,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            cu_seqlens=cu_seqlens, chunk_size=chunk_size)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    B, T = k.shape[:2]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    sidx = (None if state_indices is None or initial_state is None
            else state_indices.to(device=initial_state.device, dtype=torch.long))
    # NOTE: with cu_seqlens fla-core builds its chunk indices with a device-to-host sync (cached per
    #       cu_seqlens tensor, so once per forward); one sequence packed as [1, T] is the dense
    #       case, so it runs without cu_seqlens and without the sync.
    cu = None if cu_seqlens is None or N == 1 else cu_seqlens.to(device=q.device, dtype=torch.long)
    graphed = None
    if cu is None and B == 1 and _graphed(q, T):
        graphed = _GRAPHS.run(q, k, v, g, beta, initial_state, sidx, scale, bool(use_qk_l2norm_in_kernel), fla_chunk)
    if graphed is not None:
        o, ht = graphed
        if output_final_state and (sidx is None or gather_final_state):
            ht = ht.clone()                  # returned: not the graph's buffer, which the next replay rewrites
    else:
        if initial_state is None:
            h0 = None
        else:
            h0 = (initial_state if sidx is None else initial_state.index_select(0, sidx)).float()
        # NOTE: fla-core makes every input contiguous (input_guard); the schedule passes q, k, v as the
        #       conv's contiguous split outputs, g fp32 and beta contiguous, so none of these copies.
        o, ht = fla_chunk(q, k, v, g.float(), beta, scale=scale, initial_state=h0, output_final_state=True,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu)
    if not output_final_state:
        return o, None
    if initial_state is None:
        return o, ht
    if sidx is None:
        return o, ht.to(initial_state.dtype)
    initial_state.index_copy_(0, sidx, ht.to(initial_state.dtype))
    return o, (ht.to(initial_state.dtype) if gather_final_state else None)


# ----------------------------------------------------------------------------------------------
# Graphed chunk forward for short stages of one sequence
# ----------------------------------------------------------------------------------------------
GRAPH_MAX_TOKENS = 2048     # the longest graphed stage (0: never graphed)
# NOTE: padded lengths (multiples of fla's 64-token chunk); a stage pads to the next one (<= 50 % more
#       chunk work, which at these lengths is small next to the host time it saves).
BUCKETS = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048)


_ungraphed = 0


@contextlib.contextmanager
def ungraphed():
    """Within it, fla-core's chunk forward is called directly, never through these graphs: the prefill
    graphs (runtime/prefill_graphs.py) warm up what their own capture then records."""
    global _ungraphed
    _ungraphed += 1
    try:
        yield
    finally:
        _ungraphed -= 1


def _graph_cap() -> int:
    return min(GRAPH_MAX_TOKENS, BUCKETS[-1])


def graphed_lengths() -> tuple[int, ...]:
    """One graphed stage length in each bucket a graphed stage can pad to: the largest below the bucket
    (odd, as a context-cache hit's stage often is) or the cap. Running each once captures every graph."""
    cap, below = _graph_cap(), [0, *BUCKETS]
    return tuple(min(b - 1, cap) for b, lo in zip(BUCKETS, below) if lo < cap)


def _graphed(q: torch.Tensor, T: int) -> bool:
    return (q.is_cuda and 0 < T <= _graph_cap() and not _ungraphed
            and not torch.cuda.is_current_stream_capturing())


@dataclass
class _Entry:
    graph: "torch.cuda.CUDAGraph"
    inputs: tuple[torch.Tensor, ...]   # static q, k, v, g (fp32), beta [1, Tb, ...]; rows >= `filled` are 0
    h0: torch.Tensor                   # [1, Hv, K, V] fp32
    o: torch.Tensor                    # static outputs of the capture
    ht: torch.Tensor
    filled: int = 0                    # rows of the inputs an earlier call may have written


class _ChunkGraphs:
    """One captured fla-core chunk forward per (padded length, shapes, dtypes, scale, l2 norm, device),
    made on first use (a warm-up call on a side stream first: compiles and fla's autotuning stay out
    of the capture). All share one memory pool: each replay's outputs are copied out before the next
    replay of any of them."""

    def __init__(self) -> None:
        self.entries: dict[tuple, _Entry] = {}
        self.pool = None
        self.replays = 0
        self.failed: str | None = None     # why a capture failed: the process then calls fla-core directly

    def _entry(self, key, Tb, q, k, v, beta, scale, l2, fla_chunk) -> _Entry:
        e = self.entries.get(key)
        if e is not None:
            return e
        dev = q.device
        Hk, K, Hv, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
        zs = dict(device=dev)
        qs = torch.zeros(1, Tb, Hk, K, dtype=q.dtype, **zs)
        ks = torch.zeros(1, Tb, Hk, K, dtype=k.dtype, **zs)
        vs = torch.zeros(1, Tb, Hv, V, dtype=v.dtype, **zs)
        gs = torch.zeros(1, Tb, Hv, dtype=torch.float32, **zs)
        bs = torch.zeros(1, Tb, Hv, dtype=beta.dtype, **zs)
        h0 = torch.zeros(1, Hv, K, V, dtype=torch.float32, **zs)
        run = lambda: fla_chunk(qs, ks, vs, gs, bs, scale=scale, initial_state=h0,  # noqa: E731
                                output_final_state=True, use_qk_l2norm_in_kernel=l2)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream(dev).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # NOTE: captured while serving (first use of a length): thread_local, so another thread's CUDA
        #       call cannot invalidate it.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            o, ht = run()
        e = _Entry(graph, (qs, ks, vs, gs, bs), h0, o, ht)
        self.entries[key] = e
        return e

    def run(self, q, k, v, g, beta, state, idx, scale, l2, fla_chunk):
        """fla_chunk on one sequence of T tokens from the initial state state[idx] (idx a [1] index, or
        None: state is [1, Hv, K, V]; state None: zeros) -> (o [1, T, Hv, V], the final state [1, Hv, K, V]
        fp32: the graph's output buffer, valid until the next replay), or None when graphs are
        unavailable (a capture failed once: warned, fla-core is then called directly)."""
        if self.failed is not None:
            return None
        T = q.shape[1]
        Tb = BUCKETS[bisect.bisect_left(BUCKETS, T)]
        key = (Tb, tuple(q.shape[2:]), tuple(v.shape[2:]), q.dtype, beta.dtype, scale, l2, q.device)
        try:
            e = self._entry(key, Tb, q, k, v, beta, scale, l2, fla_chunk)
        except RuntimeError as exc:             # e.g. a fla-core version whose forward cannot be captured
            self.failed = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"ninfer chunk_gated_delta_rule: CUDA-graph capture failed ({self.failed}); calling "
                          "fla-core directly from now on")
            return None
        for dst, src in zip(e.inputs, (q, k, v, g, beta)):
            dst[:, :T].copy_(src)
            if e.filled > T:
                dst[:, T:e.filled].zero_()
        e.filled = T
        if state is None:
            e.h0.zero_()
        elif idx is not None and state.dtype == torch.float32:
            torch.index_select(state, 0, idx, out=e.h0)
        else:
            e.h0.copy_(state if idx is None else state.index_select(0, idx))
        e.graph.replay()
        self.replays += 1
        return e.o[:, :T].clone(), e.ht


_GRAPHS = _ChunkGraphs()
