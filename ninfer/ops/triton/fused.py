"""Fast fused steps (CUDA, Triton): each op is ONE kernel launch, fp32 math, no host sync.

Same arguments and results as the references (`ninfer.ops.reference.fused`, `ninfer.ops.reference.attention`,
`ninfer.ops.reference.gated_delta`); the kernels repeat the reference's roundings to the input dtype, so
bf16 results match it up to the last bit of an fp32 reduction.

    add_rms_norm(x, delta, w, eps)              x, delta [N, H]      -> (h [N, H], x + delta [N, H])
    qk_norm_rope(q, k, wq, wk, cos, sin, eps)   q [N, Hq, D], k [N, Hk, D], cos/sin [N, rot] -> q', k'
    silu_mul_halves(gu)                         gu [N, 2I]           -> silu(gate) * up [N, I]
    sigmoid_gate_mul(o, gate)                   o, gate [N, H, D] or [N, C] -> o * sigmoid(gate)
    gdn_gates(a, b, A_log, dt_bias)             a, b [N, Hv]         -> (g fp32 [N, Hv], beta [N, Hv])
    write_kv_paged(kc, vc, k, v, bt, pos, rows) k, v [N, Hkv, D] into kc, vc [P, S, Hkv, D] in place
    qk_norm_rope_write_kv(q, k, v, wq, wk, cos, sin, eps, kc, vc, bt, pos, rows)
                                                qk_norm_rope, k' and v written as write_kv_paged -> q'
                                                (one launch; the two kernels for layouts it does not take)

Inputs may be strided views (rows and heads at any stride, the last dim contiguous); outputs are
new contiguous tensors. Index tensors (block_table, positions, rows) are read in the kernel as
int32 or int64. Grids depend only on shapes, so every op is CUDA-graph capturable.
NOTE: layouts a kernel does not take (a last dim with stride != 1, rank other than the documented
ones, mixed dtypes of q/k, o/gate, x/delta, an odd rotary width) go to the reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops.reference import attention as _ref_attention
from ninfer.ops.reference import fused as _ref
from ninfer.ops.reference import gated_delta as _ref_gd
from ninfer.ops.triton import pdl
from ninfer.ops.triton.common import fround

__all__ = ["add_rms_norm", "qk_norm_rope", "silu_mul_halves", "sigmoid_gate_mul", "gdn_gates", "write_kv_paged",
           "qk_norm_rope_write_kv"]


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """[..., C] -> a 2-D view [R, C] with unit last stride, or None when that needs a copy."""
    if t.dim() == 0 or (t.stride(-1) != 1 and t.shape[-1] > 1):
        return None
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


def _heads(t: torch.Tensor) -> torch.Tensor | None:
    """[N, H, D] or [N, C] -> a 3-D view [N, H, D] ([N, 1, C] for 2-D) with unit last stride, or None."""
    if t.dim() not in (2, 3) or (t.stride(-1) != 1 and t.shape[-1] > 1):
        return None
    return t.unsqueeze(1) if t.dim() == 2 else t


# ------------------------------------------------------------------------------------------------
# add_rms_norm
# ------------------------------------------------------------------------------------------------
@triton.jit
def _add_rms_norm_kernel(x, d, w, y, xn, H, sx, sd, eps, HAS_DELTA: tl.constexpr, BH: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl.enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BH)
    m = c < H
    xv = tl.load(x + i * sx + c, mask=m, other=0.0).to(tl.float32)
    if HAS_DELTA:
        xv = fround(xv + tl.load(d + i * sd + c, mask=m, other=0.0).to(tl.float32), xn.dtype.element_ty)
        tl.store(xn + i * H + c, xv.to(xn.dtype.element_ty), mask=m)
    r = tl.rsqrt(tl.sum(xv * xv, 0) / H + eps)
    wv = tl.load(w + c, mask=m, other=0.0).to(tl.float32)
    tl.store(y + i * H + c, (xv * r * (1.0 + wv)).to(y.dtype.element_ty), mask=m)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float = 1e-6
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta [N, H] (same dtype; delta None: norm only), weight [H] zero-centred.
    Returns (rms_norm(x + delta) [N, H] in x.dtype, x + delta [N, H] (x itself when delta is None))."""
    H = x.shape[-1]
    x2 = _rows(x)
    d2 = None if delta is None else _rows(delta)
    if (x2 is None or x.numel() == 0 or H > 32768
            or (delta is not None and (d2 is None or delta.shape != x.shape or delta.dtype != x.dtype))):
        return _ref.add_rms_norm(x, delta, weight, eps)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    xn = y if delta is None else torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    BH = triton.next_power_of_2(H)
    _add_rms_norm_kernel[(x2.shape[0],)](
        x2, x2 if d2 is None else d2, weight.contiguous(), y, xn, H, x2.stride(0),
        0 if d2 is None else d2.stride(0), float(eps), HAS_DELTA=delta is not None, BH=BH,
        num_warps=max(1, min(16, BH // 512)), **pdl.launch())
    return y.view(x.shape), (x if delta is None else xn.view(x.shape))


# ------------------------------------------------------------------------------------------------
# qk_norm_rope
# ------------------------------------------------------------------------------------------------
# NOTE: not specialised on the block table's row stride: the eager path's table is as wide as its
#       pages, and each new form (== 1, divisible by 16 or not) would be a compile on a request's first
#       use; a scalar in an address gains nothing from it.
@triton.jit(do_not_specialize=["sbt0"])
def _qk_norm_rope_kernel(q, k, v, wq, wk, cos, sin, qo, ko, kc, vc, bt, pos, rows, NH, NKV, D, ROT, S,
                         sq0, sq1, sk0, sk1, sc, ss, sv0, sv1, sbt0, sbt1, spos, srow,
                         skc0, skc1, skc2, svc0, svc1, svc2, eps,
                         WRITE_KV: tl.constexpr, HAS_ROWS: tl.constexpr, HB: tl.constexpr, BD: tl.constexpr,
                         VB: tl.constexpr = 1, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    # NOTE: the program's HB heads run over the q heads then the k heads of token n; each row loads from
    #       q or k under complementary masks (masked-off lanes touch no memory). WRITE_KV: k' goes to its
    #       cache slot (not to ko), and the program copies the v heads j = program + i * programs
    #       (i < VB) to theirs, loaded with q and k (v rows in the head tile cost 34-40 registers on sm_90).
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    c = tl.arange(0, BD)
    half = ROT // 2
    is_q = h < NH
    hq = tl.where(is_q, h, 0)
    hkv = tl.where(is_q, 0, h - NH)
    mc = c < D
    mq = is_q[:, None] & mc[None, :]
    mk = ((h >= NH) & (h < NH + NKV))[:, None] & mc[None, :]
    in_rot = c < ROT
    pc = tl.where(in_rot, tl.where(c < half, c + half, c - half), c)   # rotate-half partner
    q_row = q + n * sq0 + hq[:, None] * sq1
    k_row = k + n * sk0 + hkv[:, None] * sk1
    x = (tl.load(q_row + c[None, :], mask=mq, other=0.0).to(tl.float32)
         + tl.load(k_row + c[None, :], mask=mk, other=0.0).to(tl.float32))
    if WRITE_KV:
        jv = tl.program_id(1) + tl.arange(0, VB) * tl.num_programs(1)          # this program's v heads
        mv = (jv < NKV)[:, None] & mc[None, :]
        vv = tl.load(v + n * sv0 + jv[:, None] * sv1 + c[None, :], mask=mv)
    xp = (tl.load(q_row + pc[None, :], mask=mq, other=0.0).to(tl.float32)
          + tl.load(k_row + pc[None, :], mask=mk, other=0.0).to(tl.float32))
    wqv = tl.load(wq + c, mask=mc, other=0.0).to(tl.float32)
    wkv = tl.load(wk + c, mask=mc, other=0.0).to(tl.float32)
    wqp = tl.load(wq + pc, mask=mc, other=0.0).to(tl.float32)
    wkp = tl.load(wk + pc, mask=mc, other=0.0).to(tl.float32)
    w = tl.where(is_q[:, None], wqv[None, :], wkv[None, :])
    wp = tl.where(is_q[:, None], wqp[None, :], wkp[None, :])
    r = tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
    dt: tl.constexpr = qo.dtype.element_ty
    nx = fround(x * r * (1.0 + w), dt)
    npart = fround(xp * r * (1.0 + wp), dt)
    cs = fround(tl.load(cos + n * sc + c, mask=in_rot, other=0.0).to(tl.float32), dt)[None, :]
    sn = fround(tl.load(sin + n * ss + c, mask=in_rot, other=0.0).to(tl.float32), dt)[None, :]
    sign = tl.where(c < half, -1.0, 1.0)[None, :]
    rotated = fround(nx * cs, dt) + fround(sign * npart * sn, dt)
    out = tl.where(in_rot[None, :], rotated, nx).to(dt)
    tl.store(qo + (n * NH + hq[:, None]) * D + c[None, :], out, mask=mq)
    if WRITE_KV:
        p = tl.load(pos + n * spos).to(tl.int64)
        row = tl.load(rows + n * srow).to(tl.int64) if HAS_ROWS else 0
        page = tl.load(bt + row * sbt0 + (p // S) * sbt1).to(tl.int64)
        off = p % S
        tl.store(kc + page * skc0 + off * skc1 + hkv[:, None] * skc2 + c[None, :], out.to(kc.dtype.element_ty),
                 mask=mk)
        tl.store(vc + page * svc0 + off * svc1 + jv[:, None] * svc2 + c[None, :], vv.to(vc.dtype.element_ty),
                 mask=mv)
    else:
        tl.store(ko + (n * NKV + hkv[:, None]) * D + c[None, :], out, mask=mk)


def _qk_ok(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The layouts `_qk_norm_rope_kernel` takes."""
    return (q.dim() == 3 and k.dim() == 3 and cos.dim() == 2 and sin.shape == cos.shape
            and q.shape[0] == k.shape[0] == cos.shape[0] and q.shape[2] == k.shape[2] and q.dtype == k.dtype
            and q.stride(2) == 1 and k.stride(2) == 1 and cos.stride(1) == 1 and sin.stride(1) == 1
            and cos.shape[1] % 2 == 0 and cos.shape[1] <= q.shape[2] <= 16384 and q.numel() > 0 and k.numel() > 0)


def _qk_norm_rope_launch(q, k, q_weight, k_weight, cos, sin, eps, kv=None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One `_qk_norm_rope_kernel` launch -> (q', k'); kv = (v, k_cache, v_cache, block_table, positions,
    rows) writes k' and v into the caches instead (k' None)."""
    N, NH, D = q.shape
    NKV = k.shape[1]
    qo = torch.empty((N, NH, D), dtype=q.dtype, device=q.device)
    if kv is None:
        ko = torch.empty((N, NKV, D), dtype=k.dtype, device=k.device)
        v, kc, vc, bt, pos, rows = k, ko, ko, cos, cos, None
        strides = (0,) * 12
    else:
        ko = None
        v, kc, vc, bt, pos, rows = kv
        strides = (v.stride(0), v.stride(1), bt.stride(0), bt.stride(1), pos.stride(0),
                   0 if rows is None else rows.stride(0), *kc.stride()[:3], *vc.stride()[:3])
    BD = triton.next_power_of_2(D)
    HB = max(1, min(triton.next_power_of_2(NH + NKV), 2048 // BD))
    grid = (N, triton.cdiv(NH + NKV, HB))
    _qk_norm_rope_kernel[grid](
        q, k, v, q_weight.contiguous(), k_weight.contiguous(), cos, sin, qo, qo if ko is None else ko, kc, vc,
        bt, pos, pos if rows is None else rows, NH, NKV, D, cos.shape[1], kc.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0), *strides, float(eps),
        WRITE_KV=kv is not None, HAS_ROWS=rows is not None, HB=HB, BD=BD,
        VB=triton.next_power_of_2(triton.cdiv(NKV, grid[1])), num_warps=max(1, min(8, HB * BD // 256)),
        **pdl.launch())
    return qo, ko


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, Hq, D], k [N, Hk, D] (strided views allowed), weights [D] zero-centred, cos/sin [N, rot]
    (rot even, <= D; NeoX rotate-half over [0, rot)). Returns contiguous (q' [N, Hq, D], k' [N, Hk, D])."""
    if not _qk_ok(q, k, cos, sin):
        return _ref.qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps)
    return _qk_norm_rope_launch(q, k, q_weight, k_weight, cos, sin, eps)


# ------------------------------------------------------------------------------------------------
# qk_norm_rope_write_kv
# ------------------------------------------------------------------------------------------------
def qk_norm_rope_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                          k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                          k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                          positions: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """`qk_norm_rope` of q, k [N, Hk, D] and `write_kv_paged` of k' and v [N, Hk, D] into k_cache, v_cache
    [num_pages, page_size, Hk, D] in one launch (arguments as the two ops'). Returns q' [N, Hq, D]."""
    if (_qk_ok(q, k, cos, sin) and _kv_write_ok(k_cache, v_cache, k, v, block_table, positions, rows)
            and k_cache.stride(3) == 1 and v_cache.stride(3) == 1):
        return _qk_norm_rope_launch(q, k, q_weight, k_weight, cos, sin, eps,
                                    kv=(v, k_cache, v_cache, block_table, positions, rows))[0]
    q, k = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps)
    write_kv_paged(k_cache, v_cache, k, v, block_table, positions, rows)
    return q


# ------------------------------------------------------------------------------------------------
# silu_mul_halves, sigmoid_gate_mul
# ------------------------------------------------------------------------------------------------
_EW_BLOCK = 1024


@triton.jit
def _silu_mul_halves_kernel(gu, y, I, s, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    g = tl.load(gu + n * s + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu + n * s + I + c, mask=m, other=0.0).to(tl.float32)
    dt: tl.constexpr = y.dtype.element_ty
    act = fround(g / (1.0 + tl.exp(-g)), dt)
    tl.store(y + n * I + c, (act * u).to(dt), mask=m)


def silu_mul_halves(gu: torch.Tensor) -> torch.Tensor:
    """gu [N, 2I] (gate columns first; rows may be strided) -> silu(gate) * up [N, I] in gu.dtype."""
    gu2 = _rows(gu)
    if gu2 is None or gu.numel() == 0 or gu.shape[-1] % 2:
        return _ref.silu_mul_halves(gu)
    I = gu.shape[-1] // 2
    y = torch.empty((gu2.shape[0], I), dtype=gu.dtype, device=gu.device)
    _silu_mul_halves_kernel[(gu2.shape[0], triton.cdiv(I, _EW_BLOCK))](gu2, y, I, gu2.stride(0), BLOCK=_EW_BLOCK,
                                                                       num_warps=4, **pdl.launch())
    return y.view(*gu.shape[:-1], I)


@triton.jit
def _sigmoid_gate_mul_kernel(o, g, y, H, D, so0, so1, sg0, sg1, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < H * D
    h = c // D
    d = c % D
    ov = tl.load(o + n * so0 + h * so1 + d, mask=m, other=0.0).to(tl.float32)
    gv = tl.load(g + n * sg0 + h * sg1 + d, mask=m, other=0.0).to(tl.float32)
    dt: tl.constexpr = y.dtype.element_ty
    s = fround(1.0 / (1.0 + tl.exp(-gv)), dt)
    tl.store(y + n * H * D + c, (ov * s).to(dt), mask=m)


def sigmoid_gate_mul(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """o, gate [N, H, D] or [N, C] (same shape and dtype; strided views allowed) -> o * sigmoid(gate),
    contiguous, in o.dtype."""
    o3, g3 = _heads(o), _heads(gate)
    if o3 is None or g3 is None or o.shape != gate.shape or o.dtype != gate.dtype or o.numel() == 0:
        return _ref_attention.attention_output_gate(o, gate)
    N, H, D = o3.shape
    y = torch.empty(o.shape, dtype=o.dtype, device=o.device)
    _sigmoid_gate_mul_kernel[(N, triton.cdiv(H * D, _EW_BLOCK))](
        o3, g3, y, H, D, o3.stride(0), o3.stride(1), g3.stride(0), g3.stride(1), BLOCK=_EW_BLOCK, num_warps=4,
        **pdl.launch())
    return y


# ------------------------------------------------------------------------------------------------
# gdn_gates
# ------------------------------------------------------------------------------------------------
@triton.jit
def _gdn_gates_kernel(a, b, A_log, dt_bias, g, beta, N, HV, sa, sb, BN: tl.constexpr, BH: tl.constexpr,
                      PDL: tl.constexpr = False):
    pdl.enter(PDL)
    n = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)[:, None]
    h = tl.arange(0, BH)[None, :]
    m = (n < N) & (h < HV)
    av = tl.load(a + n * sa + h, mask=m, other=0.0).to(tl.float32)
    bv = tl.load(b + n * sb + h, mask=m, other=0.0).to(tl.float32)
    A = tl.load(A_log + h, mask=h < HV, other=0.0).to(tl.float32)
    x = av + tl.load(dt_bias + h, mask=h < HV, other=0.0).to(tl.float32)
    # NOTE: softplus as torch (threshold 20); log1p(u) = log(1+u) * u / ((1+u) - 1), exact for tiny u.
    u = tl.exp(tl.minimum(x, 20.0))
    w = 1.0 + u
    lp = tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))
    sp = tl.where(x > 20.0, x, lp)
    tl.store(g + n * HV + h, -tl.exp(A) * sp, mask=m)
    tl.store(beta + n * HV + h, (1.0 / (1.0 + tl.exp(-bv))).to(beta.dtype.element_ty), mask=m)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [N, Hv] (column slices of a wider row allowed), A_log, dt_bias [Hv].
    Returns (g [N, Hv] fp32 = -exp(A_log) * softplus(a + dt_bias), beta [N, Hv] = sigmoid(b) in b.dtype)."""
    a2, b2 = _rows(a), _rows(b)
    HV = a.shape[-1]
    if a2 is None or b2 is None or a.shape != b.shape or a.numel() == 0 or HV > 4096:
        return _ref_gd.gdn_gates(a, b, A_log, dt_bias)
    N = a2.shape[0]
    g = torch.empty((N, HV), dtype=torch.float32, device=a.device)
    beta = torch.empty((N, HV), dtype=b.dtype, device=b.device)
    BH = triton.next_power_of_2(HV)
    BN = max(1, min(64, 2048 // BH))
    _gdn_gates_kernel[(triton.cdiv(N, BN),)](a2, b2, A_log.contiguous(), dt_bias.contiguous(), g, beta, N, HV,
                                             a2.stride(0), b2.stride(0), BN=BN, BH=BH, num_warps=4, **pdl.launch())
    return g.view(a.shape), beta.view(b.shape)


# ------------------------------------------------------------------------------------------------
# write_kv_paged
# ------------------------------------------------------------------------------------------------
# NOTE: sbt0 not specialised, as in `_qk_norm_rope_kernel`.
@triton.jit(do_not_specialize=["sbt0"])
def _write_kv_paged_kernel(kc, vc, k, v, bt, pos, rows, S, H, D, sbt0, sbt1, spos, srow,
                           skc0, skc1, skc2, skc3, svc0, svc1, svc2, svc3, sk0, sk1, sv0, sv1,
                           HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    n = tl.program_id(0).to(tl.int64)
    p = tl.load(pos + n * spos).to(tl.int64)
    row = tl.load(rows + n * srow).to(tl.int64) if HAS_ROWS else 0
    page = tl.load(bt + row * sbt0 + (p // S) * sbt1).to(tl.int64)
    off = p % S
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < H * D
    h = c // D
    d = c % D
    kv = tl.load(k + n * sk0 + h * sk1 + d, mask=m)
    vv = tl.load(v + n * sv0 + h * sv1 + d, mask=m)
    tl.store(kc + page * skc0 + off * skc1 + h * skc2 + d * skc3, kv.to(kc.dtype.element_ty), mask=m)
    tl.store(vc + page * svc0 + off * svc1 + h * svc2 + d * svc3, vv.to(vc.dtype.element_ty), mask=m)


def _kv_write_ok(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 block_table: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None) -> bool:
    """The layouts the paged KV write takes (`_write_kv_paged_kernel`, `_qk_norm_rope_kernel`)."""
    dev = k_cache.device
    return (k.dim() == 3 and v.dim() == 3 and k.shape == v.shape and k_cache.dim() == 4
            and k_cache.shape[2:] == k.shape[1:] and v_cache.shape == k_cache.shape
            and k.stride(2) == 1 and v.stride(2) == 1 and positions.dim() == 1 and positions.shape[0] == k.shape[0]
            and block_table.dim() == 2 and (rows is None or rows.shape == positions.shape)
            and all(t.device == dev for t in (v_cache, k, v, block_table, positions))
            and (rows is None or rows.device == dev))


def write_kv_paged(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   block_table: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Write N tokens' k, v [N, Hkv, D] (strided views allowed) into k_cache, v_cache
    [num_pages, page_size, Hkv, D] in place (cast to the pool dtype). block_table [B, max_pages],
    positions [N], rows [N] or None (all row 0); int32 or int64, on the cache's device."""
    if not _kv_write_ok(k_cache, v_cache, k, v, block_table, positions, rows):
        return _ref_attention.write_kv_paged(k_cache, v_cache, k, v, block_table, positions, rows)
    N, H, D = k.shape
    if N == 0:
        return None
    r = positions if rows is None else rows
    _write_kv_paged_kernel[(N, triton.cdiv(H * D, _EW_BLOCK))](
        k_cache, v_cache, k, v, block_table, positions, r, k_cache.shape[1], H, D,
        block_table.stride(0), block_table.stride(1), positions.stride(0), r.stride(0),
        *k_cache.stride(), *v_cache.stride(), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        HAS_ROWS=rows is not None, BLOCK=_EW_BLOCK, num_warps=4, **pdl.launch())
    return None
