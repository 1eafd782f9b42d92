"""Skinny GEMM for decode (Triton): y = x @ w.T for x [M, K] with M <= 8 rows, w [N, K] (nn.Linear layout).

`linear(x, w)` has the signature and result of `ninfer.ops.reference.fused.linear`. It runs the Triton kernel
only for bf16/fp16 inputs with M <= 8 rows on shapes the tuning table marks as faster than cuBLAS
(`gemv_configs`; every other shape goes to `F.linear`). `gemv(x, w, config)` forces the kernel (tests, bench).

Decode reads each weight once, so the kernel is a weight stream: program (n, s) reads the tile
sequence w[n*BN:(n+1)*BN, K-range s] in [BN, BK] blocks (16-byte vector loads along K, evict-first,
no masks when BK divides the range: rows past N are clamped to N-1 and never stored), x rows are
loaded once per K block and reused for all M rows. Two inner products (`GemvConfig.dot`):

    dot=False  fp32 FMA: M_PAD == 1 accumulates acc[BN, BK] += w * x and reduces once at the end;
               M_PAD > 1 reduces sum_k(w[None] * x[:, None]) per block into acc[M_PAD, BN]
    dot=True   tensor cores on the transposed product: acc[BN, 16] += w[BN, BK] @ x[16, BK].T
               (rows past M duplicate row M-1 and are dropped); the loads feed tl.dot, so Triton
               pipelines them over num_stages shared-memory buffers (cp.async)

Split-K (SPLIT_K > 1, for few rows and long K, e.g. 5120 x 17408 where 5120 / BN programs cannot
keep every SM streaming): every split writes its fp32 partial to ws[s, M, N] (torch.empty from the
caller's stream allocator), then bumps an arrival counter of its N tile; the last split to arrive
sums the SPLIT_K partials in a fixed order (deterministic), writes y in x.dtype and resets the
counter to 0. One launch, no memset, no host sync: CUDA-graph capturable.

    counters (int32, per device, zero between launches; one per N tile, allocated outside capture)
    ws       [SPLIT_K, M, N] fp32   written by every split, read by the last one

Residual / norm fold (one row; `gemv(residual=...)`, `gemv(norm=RowNorm(...))`, used by `linear` for the
schedule's `Residual` / `NormedRows`, see `ninfer.ops.reference.fused`): the epilogue adds the residual and stores
h with each N tile's sum of h^2 (parts [M, n_tiles] fp32); a later launch reading h as x applies
rms_norm with rstd = rsqrt(sum(parts) / K + eps) in its x load. The sum runs in a fixed order (the
parts block of one program), so it is deterministic; it differs from the norm kernel's order only in
fp32 rounding.

PDL: the first weight block is loaded before `griddepcontrol.wait` (weights are never written by a
kernel), so it overlaps the previous kernel's tail.

NOTE: the counters are shared by all launches on a device, so split-K launches must not run
      concurrently on two streams (the Program issues its decode on one stream).
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ninfer.ops.reference.fused import NormedRows, Residual
from ninfer.ops.triton import pdl
from ninfer.ops.triton.fused import add_rms_norm as _fast_add_rms_norm, silu_mul_halves as _fast_silu_mul_halves
from ninfer.ops.triton.gemv_configs import (MAX_ROWS, GemvConfig, concurrent_ok, config_for, default_config,
                                            m_bucket, sweep_space, use_swiglu, use_triton)

__all__ = ["GemvConfig", "RowNorm", "MAX_ROWS", "linear", "linear_swiglu", "gemv", "use_triton", "use_swiglu",
           "concurrent_ok", "m_bucket", "config_for", "default_config", "sweep_space"]


# ------------------------------------------------------------------------------------------------
# kernel
# ------------------------------------------------------------------------------------------------
@triton.jit
def _load_w(w_rows, offs_k, k_end, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    if EVEN_K:
        offs_k = tl.max_contiguous(tl.multiple_of(offs_k, BLOCK_K), BLOCK_K)
        w = tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first")
    else:
        w = tl.load(w_rows + offs_k[None, :], mask=(offs_k < k_end)[None, :], other=0.0,
                    eviction_policy="evict_first")
    return w


@triton.jit
def _gemv_block(acc, w, x_rows, offs_k, k_end, K, M_PAD: tl.constexpr, DOT: tl.constexpr, EVEN_K: tl.constexpr,
                PREC: tl.constexpr, SWIGLU: tl.constexpr, BLOCK_K: tl.constexpr, nw_ptr, rstd, NORM: tl.constexpr):
    """acc += the products of one [BLOCK_N, BLOCK_K] weight block `w` with the x rows' K block.
    NORM: x is h and the row's rms_norm is applied on the fly: x = h * rstd * (1 + nw[k]), rounded to
    x's dtype (as the add_rms_norm kernel stores it)."""
    if EVEN_K:
        offs_k = tl.max_contiguous(tl.multiple_of(offs_k, BLOCK_K), BLOCK_K)
        xv = tl.load(x_rows + offs_k[None, :])
        if SWIGLU:
            up = tl.load(x_rows + K + offs_k[None, :])
    else:
        km = offs_k < k_end
        xv = tl.load(x_rows + offs_k[None, :], mask=km[None, :], other=0.0)
        if SWIGLU:
            up = tl.load(x_rows + K + offs_k[None, :], mask=km[None, :], other=0.0)
    if SWIGLU:
        g = xv.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(xv.dtype).to(tl.float32)
        xv = (act * up.to(tl.float32)).to(xv.dtype)
    if NORM:
        if EVEN_K:
            nw = tl.load(nw_ptr + offs_k).to(tl.float32)
        else:
            nw = tl.load(nw_ptr + offs_k, mask=offs_k < k_end, other=0.0).to(tl.float32)
        xv = (xv.to(tl.float32) * rstd * (1.0 + nw[None, :])).to(xv.dtype)
    if DOT:
        acc = tl.dot(w, tl.trans(xv), acc, input_precision=PREC)
    elif M_PAD == 1:
        acc += w.to(tl.float32) * xv.to(tl.float32)
    else:
        acc += tl.sum(w.to(tl.float32)[None, :, :] * xv.to(tl.float32)[:, None, :], axis=2)
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, stride_ym, k_per_split,
                 res_ptr, stride_rm, parts_ptr, n_parts, nw_ptr, eps,
                 M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                 DOT: tl.constexpr, EVEN_K: tl.constexpr, PREC: tl.constexpr, SWIGLU: tl.constexpr = False,
                 RESID: tl.constexpr = False, NORM: tl.constexpr = False, BP: tl.constexpr = 1,
                 PREFETCH: tl.constexpr = False, PDL: tl.constexpr = False):
    """y[m, n] = sum_k x[m, k] w[n, k]; program (pid_n, pid_k) covers rows pid_n*BLOCK_N.. and the K range
    [pid_k * k_per_split, +k_per_split) (k_per_split a multiple of BLOCK_K).
    SWIGLU: x_ptr holds [gate | up] rows of 2K and x[m, k] = silu(gate[m, k]) * up[m, k], rounded as
    `silu_mul` rounds it (silu to x's dtype, then the product).
    RESID: y = residual + (x @ w.T rounded to y's dtype), rounded (the schedule's residual add), and
    parts[m, pid_n] = sum over the tile's columns of y^2 in fp32 (n_parts = number of N tiles).
    NORM (M == 1): x is the residual row h; x = rms_norm(h) = h * rsqrt(sum(parts[0, :n_parts]) / K + eps)
    * (1 + nw) on the fly, the parts written by the RESID launch that produced h."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, M_PAD)
    # NOTE: clamped row indices keep every load in bounds without a mask; the duplicates are not stored.
    w_rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + tl.minimum(offs_m, M - 1).to(tl.int64)[:, None] * stride_xm
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if DOT:
        acc = tl.zeros([BLOCK_N, M_PAD], dtype=tl.float32)
    elif M_PAD == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    # NOTE: the first weight block is loaded before the PDL wait: weights are never written by an
    #       earlier kernel, so under PDL this load overlaps the previous kernel's tail; x, ws and the
    #       counters are touched only after it (every split has at least one block: no empty splits).
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w = _load_w(w_rows, offs_k, k_end, EVEN_K, BLOCK_K)
    pdl.enter(PDL)
    rstd = 0.0
    if NORM:
        offs_p = tl.arange(0, BP)
        pv = tl.load(parts_ptr + offs_p, mask=offs_p < n_parts, other=0.0)
        rstd = tl.rsqrt(tl.sum(pv, 0) / K + eps)
    if PREFETCH:
        # NOTE: block k+1's weight load is issued before block k's products, so two blocks per program
        #       are in flight (the FMA path is not software-pipelined by Triton); the last block is
        #       peeled after the loop, so nothing past the split's K range is read.
        for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
            offs_next = k0 + tl.arange(0, BLOCK_K)
            w_next = _load_w(w_rows, offs_next, k_end, EVEN_K, BLOCK_K)
            acc = _gemv_block(acc, w, x_rows, offs_k, k_end, K, M_PAD, DOT, EVEN_K, PREC, SWIGLU, BLOCK_K, nw_ptr,
                              rstd, NORM)
            w = w_next
            offs_k = offs_next
        acc = _gemv_block(acc, w, x_rows, offs_k, k_end, K, M_PAD, DOT, EVEN_K, PREC, SWIGLU, BLOCK_K, nw_ptr, rstd,
                          NORM)
    else:
        acc = _gemv_block(acc, w, x_rows, offs_k, k_end, K, M_PAD, DOT, EVEN_K, PREC, SWIGLU, BLOCK_K, nw_ptr, rstd,
                          NORM)
        for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            w = _load_w(w_rows, offs_k, k_end, EVEN_K, BLOCK_K)
            acc = _gemv_block(acc, w, x_rows, offs_k, k_end, K, M_PAD, DOT, EVEN_K, PREC, SWIGLU, BLOCK_K, nw_ptr,
                              rstd, NORM)
    if DOT:
        res = tl.trans(acc)
    elif M_PAD == 1:
        res = tl.sum(acc, axis=1)[None, :]
    else:
        res = acc
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT:
        part = offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k * M * N + part, res, mask=mask)
        # NOTE: all threads' partial stores happen before the release of the (single-thread) arrival.
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(1) - 1:
            total = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
            for s in range(0, tl.num_programs(1)):
                total += tl.load(ws_ptr + s * M * N + part, mask=mask, other=0.0, cache_modifier=".cg")
            _store_y(total, y_ptr, stride_ym, offs_m, offs_n, mask, res_ptr, stride_rm, parts_ptr, n_parts, pid_n, M,
                     RESID)
            tl.store(cnt_ptr + pid_n, 0)
    else:
        _store_y(res, y_ptr, stride_ym, offs_m, offs_n, mask, res_ptr, stride_rm, parts_ptr, n_parts, pid_n, M, RESID)


@triton.jit
def _store_y(acc, y_ptr, stride_ym, offs_m, offs_n, mask, res_ptr, stride_rm, parts_ptr, n_parts, pid_n, M,
             RESID: tl.constexpr):
    """Store the [M_PAD, BLOCK_N] result tile (RESID: residual + it, and the tile's sums of squares)."""
    ty = y_ptr.dtype.element_ty
    if RESID:
        r = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        hv = (r + acc.to(ty).to(tl.float32)).to(ty)
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], hv, mask=mask)
        hf = tl.where(mask, hv.to(tl.float32), 0.0)
        tl.store(parts_ptr + offs_m * n_parts + pid_n, tl.sum(hf * hf, axis=1), mask=offs_m < M)
    else:
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(ty), mask=mask)


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_WARNED: set[str] = set()


def _counters(device: torch.device, n_tiles: int) -> torch.Tensor | None:
    """The device's zeroed arrival counters (>= n_tiles); None when they would have to be allocated
    during a CUDA-graph capture (the caller then falls back to cuBLAS)."""
    c = _COUNTERS.get(device)
    if c is not None and c.numel() >= n_tiles:
        return c
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    c = torch.zeros(max(1 << 16, triton.next_power_of_2(n_tiles)), dtype=torch.int32, device=device)
    _COUNTERS[device] = c
    return c


class RowNorm(NamedTuple):
    """A pending rms_norm of the rows fed to `gemv(norm=...)`: parts [M, P] fp32 partial sums of squares
    of those rows (from a `gemv(residual=...)` launch), the zero-centred weight [K], eps."""
    parts: torch.Tensor
    weight: torch.Tensor
    eps: float


def _torch_norm(h: torch.Tensor, norm: RowNorm) -> torch.Tensor:
    """rms_norm of h with the sum of squares taken from norm.parts (the fallbacks of the fused modes)."""
    r = torch.rsqrt(norm.parts.sum(1, keepdim=True) / h.shape[1] + norm.eps)
    return (h.float() * r * (1.0 + norm.weight.float())).to(h.dtype)


def _torch_parts(h: torch.Tensor, block_n: int) -> torch.Tensor:
    M, N = h.shape
    hf = torch.zeros(M, triton.cdiv(N, block_n) * block_n, dtype=torch.float32, device=h.device)
    hf[:, :N] = h.float()
    return (hf * hf).view(M, -1, block_n).sum(2)


def gemv(x: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None, *, swiglu: bool = False,
         residual: torch.Tensor | None = None, norm: RowNorm | None = None):
    """The kernel, forced: x [M, K] (unit last stride, 1 <= M <= 8) @ w[N, K].T -> [M, N] in x.dtype.
    fp32 accumulation; fp32 inputs are allowed (tests) and use IEEE fp32 dot products.
    swiglu: x is [M, 2K] = [gate | up] and the product is silu_mul(gate, up) @ w.T (one launch).
    residual [M, N] (x's dtype): returns (h, parts): h = residual + x @ w.T (each rounded to x's dtype,
      as `F.linear` then the residual add round them) and parts [M, n_tiles] fp32, the sums of h^2 per
      column tile, for a later `gemv(h, w2, norm=RowNorm(parts, weight, eps))`.
    norm (M == 1, not with swiglu): x is a residual row h; the product is rms_norm(h) @ w.T with the
      norm's sum of squares from norm.parts (one launch instead of the norm kernel + the GEMV)."""
    M, K = x.shape
    if swiglu:
        if K % 2:
            raise ValueError(f"gemv swiglu: x has an odd width {K} (expected [gate | up])")
        K //= 2
    N = w.shape[0]
    if not (1 <= M <= MAX_ROWS) or w.shape[1] != K or x.stride(1) != 1 or w.stride(1) != 1 or x.dtype != w.dtype:
        raise ValueError(f"gemv: unsupported x {tuple(x.shape)} {x.dtype} strides {x.stride()}, "
                         f"w {tuple(w.shape)} {w.dtype} strides {w.stride()}")
    if norm is not None and (M != 1 or swiglu or norm.parts.shape[0] != 1 or norm.parts.dtype != torch.float32
                             or not norm.parts.is_contiguous() or norm.parts.shape[1] > 4096 or norm.weight.shape != (K,)
                             or not norm.weight.is_contiguous()):
        raise ValueError(f"gemv norm: needs one row, no swiglu, contiguous fp32 parts [1, P <= 4096] and a weight of "
                         f"{K} (got x {tuple(x.shape)}, parts {tuple(norm.parts.shape)}, "
                         f"weight {tuple(norm.weight.shape)})")
    if residual is not None and (residual.shape != (M, N) or residual.dtype != x.dtype or residual.stride(-1) != 1):
        raise ValueError(f"gemv residual: expected [{M}, {N}] {x.dtype} with unit last stride, "
                         f"got {tuple(residual.shape)} {residual.dtype}")
    cfg = config if config is not None else config_for(N, K, M, x.device)
    bn, bk = cfg.block_n, cfg.block_k
    n_tiles = triton.cdiv(N, bn)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    parts = torch.empty(M, n_tiles, dtype=torch.float32, device=x.device) if residual is not None else None
    if N == 0 or K == 0:
        if K == 0:
            y.zero_()
        if residual is None:
            return y
        h = residual + y
        return h, _torch_parts(h, bn)
    kblocks = triton.cdiv(K, bk)
    split = max(1, min(cfg.split_k, kblocks))
    k_per_split = triton.cdiv(kblocks, split) * bk
    split = triton.cdiv(K, k_per_split)                    # no empty splits
    if split > 1:
        cnt = _counters(x.device, n_tiles)
        if cnt is None:
            if "capture" not in _WARNED:
                _WARNED.add("capture")
                warnings.warn("ninfer gemv: split-K counters first needed during CUDA-graph capture; "
                              "using F.linear (run the op once before capturing)")
            xin = _fast_silu_mul_halves(x) if swiglu else _torch_norm(x, norm) if norm is not None else x
            out = F.linear(xin, w)
            if residual is None:
                return out
            h = residual + out
            return h, _torch_parts(h, bn)
        ws = torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    else:
        cnt, ws = y, y                                     # unused (SPLIT=False)
    m_pad = 16 if cfg.dot else triton.next_power_of_2(M)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    res = residual if residual is not None else y
    pp = parts if parts is not None else norm.parts if norm is not None else ws
    n_parts = n_tiles if residual is not None else norm.parts.shape[1] if norm is not None else 1
    _gemv_kernel[(n_tiles, split)](
        x, w, y, ws, cnt, M, N, K, x.stride(0), w.stride(0), y.stride(0), k_per_split,
        res, res.stride(0), pp, n_parts, norm.weight if norm is not None else w,
        float(norm.eps) if norm is not None else 0.0,
        M_PAD=m_pad, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split > 1, DOT=cfg.dot, EVEN_K=K % bk == 0, PREC=prec,
        SWIGLU=swiglu, RESID=residual is not None, NORM=norm is not None, PREFETCH=cfg.prefetch,
        BP=triton.next_power_of_2(n_parts) if norm is not None else 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch())
    return y if residual is None else (y, parts)


def _eligible(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype and w.dim() == 2
            and x.dim() >= 1 and x.shape[-1] == w.shape[1] and x.stride(-1) == 1 and w.stride(1) == 1)


def _fold(residual: torch.Tensor | None, x2: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """The residual as [M, N] rows when `linear` may fold it (one row; else None: not folded)."""
    if residual is None or x2.shape[0] != 1 or residual.numel() != w.shape[0] or residual.dtype != x2.dtype:
        return None
    r = residual.reshape(1, w.shape[0])
    return r if r.stride(-1) == 1 else None


# NOTE: a prompt stage's residual add runs in the GEMM that makes the delta (cuBLAS with beta = 1, in place
#       on the residual stream: `addmm_`, no copy of it first): the norm after it then reads one [M, H] tensor
#       and writes one (a NormedRows without parts), where add_rms_norm read two and wrote two; the GEMM's
#       epilogue reads the residual under its compute. The sum is rounded once (x + the fp32 product), where
#       the unfolded path rounds the product first.
def _gemm_fold(residual: torch.Tensor | None, x2: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """The residual as [M, N] rows that `linear` may update in place with the GEMM (more than MAX_ROWS
    rows; else None: not folded)."""
    if (residual is None or x2.shape[0] <= MAX_ROWS or residual.dtype != x2.dtype
            or residual.numel() != x2.shape[0] * w.shape[0] or not residual.is_contiguous()):
        return None
    return residual.view(x2.shape[0], w.shape[0])


def linear(x: "torch.Tensor | NormedRows", w: torch.Tensor, residual: torch.Tensor | None = None):
    """x [..., K] @ w[N, K].T -> [..., N] in x.dtype (`ninfer.ops.reference.fused.linear`). The Triton kernel for
    CUDA bf16/fp16 with <= 8 rows on shapes the tuning table marks faster (`use_triton`); F.linear otherwise.
    At one row on the kernel's path the residual add + norm fold into it (see `ninfer.ops.reference.fused`):
    `residual` given -> `Residual(h, parts)`; x a NormedRows with parts -> the norm applied in the
    kernel's x load. Past MAX_ROWS rows (a prompt stage) the residual add runs in the cuBLAS GEMM,
    in place on `residual` (`_gemm_fold`) -> `Residual(h, None)`, h being `residual` itself. Otherwise a
    NormedRows is normed by the fast kernel first and `residual` is left to the caller (the plain
    product is returned)."""
    if isinstance(x, NormedRows):
        h = x.h.reshape(-1, x.h.shape[-1]) if x.h.dim() != 2 else x.h
        if (x.parts is not None and h.shape[0] == 1 and _eligible(h, w) and use_triton(w.shape[0], w.shape[1], 1)
                and x.parts.shape[1] <= 4096 and x.weight.shape == (w.shape[1],) and x.weight.is_contiguous()
                and residual is None):
            return gemv(h, w, norm=RowNorm(x.parts, x.weight, x.eps)).reshape(*x.h.shape[:-1], w.shape[0])
        x = _fast_add_rms_norm(x.h, None, x.weight, x.eps)[0]
    if _eligible(x, w):
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1]) if x.dim() > 2 else x.unsqueeze(0)
        M = x2.shape[0]
        if 1 <= M <= MAX_ROWS and use_triton(w.shape[0], w.shape[1], M) and x2.stride(-1) == 1:
            r = _fold(residual, x2, w)
            if r is not None:
                h, parts = gemv(x2, w, residual=r)
                return Residual(h.reshape(*x.shape[:-1], w.shape[0]), parts)
            return gemv(x2, w).reshape(*x.shape[:-1], w.shape[0])
        r = _gemm_fold(residual, x2, w)
        if r is not None:
            return Residual(r.addmm_(x2, w.t()).view(*x.shape[:-1], w.shape[0]), None)
    return F.linear(x, w)


def linear_swiglu(gu: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None):
    """silu_mul_halves(gu) @ w.T (`ninfer.ops.reference.fused.linear_swiglu`): the SwiGLU folded into the GEMV's
    x load (one launch instead of two) for the shapes the tuning table marks (`use_swiglu`);
    otherwise the fast SwiGLU kernel, then `linear`. `residual` as in `linear`."""
    rows = gu.reshape(-1, gu.shape[-1])
    M, N, K = rows.shape[0], w.shape[0], gu.shape[-1] // 2
    if (gu.is_cuda and gu.dtype in (torch.bfloat16, torch.float16) and w.dtype == gu.dtype and 1 <= M <= MAX_ROWS
            and gu.shape[-1] == 2 * K and w.dim() == 2 and w.shape[1] == K and rows.stride(-1) == 1
            and w.stride(1) == 1 and use_swiglu(N, K, M)):
        cfg = config_for(N, K, M, gu.device)
        r = _fold(residual, rows, w)
        if r is not None:
            h, parts = gemv(rows, w, cfg, swiglu=True, residual=r)
            return Residual(h.view(*gu.shape[:-1], N), parts)
        return gemv(rows, w, cfg, swiglu=True).view(*gu.shape[:-1], N)
    return linear(_fast_silu_mul_halves(gu), w, residual=residual)
