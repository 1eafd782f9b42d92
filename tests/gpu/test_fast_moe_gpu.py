"""Fast MoE ops (`ninfer.ops.triton.moe`) and the SparseMoE leaf on them vs the PyTorch references.

Run on the GPU machine (`pytest -m gpu`); skipped without CUDA. With TRITON_INTERPRET=1 and
NINFER_FAST_TEST_DEVICE=cpu the kernels run in Triton's CPU interpreter: small shapes only, and the
bf16 grouped GEMM (prefill) is skipped there (the interpreter's bf16 tl.dot is wrong).

Checks: routing weights and the selected probabilities (ids only where no tie decides them);
routed experts at decode sizes (T = 1..8) and prefill sizes
(T = 1, 65, 500, 2048; the grouped GEMM forced for small T), with and without the folded shared
expert, the 35B-A3B shapes on the GPU; routing folded into the first decode kernel
(`route_moe_experts`: top 8 of 256, the tiny model's shapes, tied logits, NaN-poisoned buffers,
several tilings); chunked prefill; CUDA-graph capture (fails on any host sync); the leaf, fast vs
reference.
"""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from ninfer.ops import reference as ref
from ninfer.ops.reference.moe import SharedExpert

from support.fast_env import DEV as _DEV, GPU_MARKS, INTERPRET as _INTERPRET, STRICT  # noqa: F401
from support.numerics import rel_rms

pytestmark = GPU_MARKS

TOL = {torch.float32: 2e-3, torch.bfloat16: 1e-2}
# NOTE: the interpreter's round-towards-zero to bf16 biases every rounded intermediate (act, out) the same
#       way, which alone costs ~1.5e-2 on some draws; the GPU rounds to nearest and is held to TOL.
ROUTED_TOL = {torch.float32: 2e-3, torch.bfloat16: 2.5e-2 if _INTERPRET else 1e-2}
# (E, k, H, I, Is): odd sizes (masks on every edge) everywhere; the 35B-A3B sizes on the GPU.
ODD = (16, 4, 96, 40, 24)
EVEN = (16, 4, 256, 128, 32)       # the prefill GEMMs' tiles divide H and I (both tile sets): unmasked loads
A3B = (256, 8, 2048, 512, 512)
SHAPES = [ODD, EVEN] if _INTERPRET else [ODD, EVEN, A3B]
TINY = (8, 2, 64, 32, 32)          # qwen3_6-tiny-moe
WIDE = (256, 8, 64, 32, 32)        # the 35B-A3B routing (top 8 of 256) on small experts
ROUTED_SHAPES = [ODD, TINY, WIDE] + ([] if _INTERPRET else [A3B])



def poison_allocator() -> None:
    """Fill free cached memory with NaN so that outputs not fully written show up."""
    if _DEV == "cuda":
        t = torch.full((64 << 20,), float("nan"), dtype=torch.float32, device="cuda")
        del t


class _PoisonedTorch:
    """`torch` for the fast module under test: every `torch.empty` comes back filled with NaN (floats)
    or 0 (ints), on the CPU too, so an output element a kernel does not write shows up."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*a, **k):
        t = torch.empty(*a, **k)
        return t.fill_(float("nan") if t.is_floating_point() else 0)


@pytest.fixture
def poisoned(monkeypatch):
    from ninfer.ops.triton import moe as fm, moe_decode, moe_prefill, moe_routing
    for mod in (fm, moe_decode, moe_prefill, moe_routing):
        monkeypatch.setattr(mod, "torch", _PoisonedTorch())


def lowest_id_routing(logits: torch.Tensor, k: int) -> "ref.MoeRouting":
    """The reference routing with ties broken as the fast kernels break them (lowest expert id first)."""
    p = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, ids = torch.sort(p, dim=-1, descending=True, stable=True)
    w, ids = w[:, :k], ids[:, :k]
    return ref.MoeRouting((w / w.sum(-1, keepdim=True)).to(logits.dtype), ids)


def randn(*shape, dtype=torch.float32, g=None, scale=1.0):
    return (torch.randn(*shape, generator=g, device=_DEV, dtype=torch.float32) * scale).to(dtype)


def gen(seed: int) -> torch.Generator:
    g = torch.Generator(device=_DEV)
    g.manual_seed(seed)
    return g


def skip_bf16_dot(dtype):
    if _INTERPRET and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter computes bf16 tl.dot wrongly")


def experts(shape, dtype, g):
    E, k, H, I, Is = shape
    gate_up = randn(E, 2 * I, H, dtype=dtype, g=g, scale=H ** -0.5)
    down = randn(E, H, I, dtype=dtype, g=g, scale=I ** -0.5)
    return gate_up, down


def shared_expert(T, shape, dtype, g):
    E, k, H, I, Is = shape
    # NOTE: strided views of one wider row, as the leaf passes them (columns of its fused GEMM)
    y = randn(T, 2 * Is + 1 + E, dtype=dtype, g=g)
    return SharedExpert(y[:, :2 * Is], y[:, 2 * Is:2 * Is + 1], randn(H, Is, dtype=dtype, g=g, scale=Is ** -0.5))


def boundary_ties(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[T] bool: rows whose k-th and (k+1)-th probabilities are equal (the selected set is not unique)."""
    p = torch.softmax(logits.float(), -1).sort(-1, descending=True).values
    if k >= p.shape[1]:
        return torch.zeros(p.shape[0], dtype=torch.bool, device=p.device)
    return p[:, k - 1] == p[:, k]


# ------------------------------------------------------------------------------------------------
# routing
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 65])
@pytest.mark.parametrize("E,k", [(8, 2), (16, 4), (256, 8), (100, 7)])
def test_route_topk(dtype, T, E, k):
    from ninfer.ops.triton import moe as fm
    g = gen(1)
    wide = randn(T, E + 3, dtype=dtype, g=g, scale=2.0)
    logits = wide[:, 3:]                                        # strided rows, as in the leaf
    r = fm.route_topk(logits, k)
    rr = ref.route_topk(logits, k)
    assert r.weights.dtype == dtype and r.ids.dtype == torch.int64 and r.ids.shape == (T, k)
    assert ((r.ids >= 0) & (r.ids < E)).all()
    assert (r.ids.sort(-1).values.diff(dim=-1) > 0).all(), "an expert selected twice"
    p = torch.softmax(logits.float(), -1)
    sel, sel_ref = p.gather(1, r.ids), p.gather(1, rr.ids)
    assert (sel.diff(dim=-1) <= 0).all(), "not by decreasing probability"
    torch.testing.assert_close(sel, sel_ref, rtol=0, atol=0)    # the same probabilities, ties aside
    assert rel_rms(r.weights, rr.weights) < TOL[dtype] / STRICT
    torch.testing.assert_close(r.weights.float().sum(-1), torch.ones(T, device=_DEV), rtol=0, atol=1e-2)
    clear = ~boundary_ties(logits, k)
    # NOTE: only the first tied position can differ; compare ids where all probabilities are distinct
    distinct = clear & (sel.diff(dim=-1) < 0).all(-1)
    assert torch.equal(r.ids[distinct], rr.ids[distinct])


def test_route_topk_ties_go_to_the_lowest_id():
    from ninfer.ops.triton import moe as fm
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 1.0, -2.0], [1.0] * 6], device=_DEV)
    r = fm.route_topk(logits, 3)
    assert r.ids.tolist() == [[1, 3, 2], [0, 1, 2]]
    rr = ref.route_topk(logits, 3)
    torch.testing.assert_close(r.weights, rr.weights)


# ------------------------------------------------------------------------------------------------
# routed experts
# ------------------------------------------------------------------------------------------------
def _check_experts(shape, dtype, T, with_shared, seed, **kw):
    from ninfer.ops.triton import moe as fm
    E, k, H, I, Is = shape
    g = gen(seed)
    x = randn(T, H, dtype=dtype, g=g)
    gate_up, down = experts(shape, dtype, g)
    routing = ref.route_topk(randn(T, E, dtype=dtype, g=g), k)
    shared = shared_expert(T, shape, dtype, g) if with_shared else None
    poison_allocator()
    out = fm.moe_experts(x, routing, gate_up, down, shared=shared, **kw)
    assert out.dtype == dtype and out.shape == (T, H)
    assert rel_rms(out, ref.moe_experts(x, routing, gate_up, down, shared=shared)) < TOL[dtype]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("with_shared", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 2, 3, 8])
def test_moe_experts_decode(shape, with_shared, dtype, T, poisoned):
    from ninfer.ops.triton import moe as fm
    assert T * shape[1] <= fm.MAX_PAIRS
    _check_experts(shape, dtype, T, with_shared, seed=T)


# ------------------------------------------------------------------------------------------------
# routing folded into the first decode kernel
# ------------------------------------------------------------------------------------------------
def _check_routed(shape, dtype, T, with_shared, seed, logits=None, config=None):
    from ninfer.ops.triton import moe as fm
    E, k, H, I, Is = shape
    g = gen(seed)
    x = randn(T, H, dtype=dtype, g=g)
    gate_up, down = experts(shape, dtype, g)
    shared = shared_expert(T, shape, dtype, g) if with_shared else None
    if logits is None:
        wide = randn(T, E + 5, dtype=dtype, g=g, scale=2.0)
        logits = wide[:, 5:]                                    # strided rows, as in the leaf
    out = fm.route_moe_experts(x, logits, k, gate_up, down, shared=shared, config=config)
    assert out.dtype == dtype and out.shape == (T, H)
    want = ref.moe_experts(x, lowest_id_routing(logits, k), gate_up, down, shared=shared)
    assert rel_rms(out, want) < ROUTED_TOL[dtype]
    # the same routing and sums as the separate routing kernel + the expert kernels reading its ids
    apart = fm.moe_experts(x, fm.route_topk(logits, k), gate_up, down, shared=shared, config=config)
    assert rel_rms(out, apart) < TOL[dtype] / 4
    return out


@pytest.mark.parametrize("shape", ROUTED_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("with_shared", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 3, 8])
def test_route_moe_experts_decode(shape, with_shared, dtype, T, poisoned):
    _check_routed(shape, dtype, T, with_shared, seed=300 + T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_shared", [False, True])
def test_route_moe_experts_tied_logits(dtype, with_shared, poisoned):
    """Ties inside the top k, at the k-th place and across a whole row: the lowest ids win, as in
    `route_topk`, and the weights of tied experts are equal."""
    E, k, H, I, Is = WIDE
    T = 4
    g = gen(9)
    logits = randn(T, E, dtype=dtype, g=g)
    logits[0, [3, 77, 200]] = 5.0                               # a three-way tie inside the top 8
    logits[1, :7] = 6.0
    logits[1, [50, 9, 130]] = 4.0                               # the 8th place: 9 beats 50 and 130
    logits[2] = 0.25                                            # all 256 tied: experts 0..7
    logits[3, ::2] = -1.0
    logits[3, 1::2] = 1.5                                       # 128-way tie: experts 1, 3, .., 15
    _check_routed(WIDE, dtype, T, with_shared, seed=10, logits=logits)
    from ninfer.ops.triton import moe as fm
    r = fm.route_topk(logits, k)
    assert r.ids[1].tolist()[-1] == 9 and r.ids[2].tolist() == list(range(8))
    assert r.ids[3].tolist() == list(range(1, 16, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_token_routing_in_the_gate_up_kernel_equals_route_topk(dtype):
    """At one token the gate|up kernel routes itself: the ids it stores for the down kernel equal
    `route_topk`'s, ties included (test_route_moe_experts_tied_logits runs 4 tokens, which route apart),
    and so do the weights."""
    from ninfer.ops.triton import moe as fm
    from ninfer.ops.triton.moe_decode import decode
    E, k, H, I, Is = WIDE
    g = gen(12)
    gate_up, down = experts(WIDE, dtype, g)
    x = randn(1, H, dtype=dtype, g=g)
    rows = randn(8, E, dtype=dtype, g=g, scale=2.0)
    rows[0, [3, 77, 200]] = 5.0
    rows[1, :7] = 6.0
    rows[1, [50, 9, 130]] = 4.0
    rows[2] = 0.25
    rows[3, ::2] = -1.0
    rows[3, 1::2] = 1.5
    rows[4, 250:] = 9.0                                         # the top 6 at the end of the row
    rows[5, 60:68] = 7.0                                        # the top 8 tied in one run
    for r in range(rows.shape[0]):
        lg = rows[r:r + 1]
        _, w, ids = decode(x, gate_up, down, None, k, logits=lg)
        want = fm.route_topk(lg, k)
        assert ids.tolist() == want.ids.tolist(), r
        torch.testing.assert_close(w.float(), want.weights.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("config", [(2, 32, 4, 2, 16, 4), (4, 16, 2, 8, 32, 2), (1, 4096, 8, 16, 1024, 8)],
                         ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("shape", [ODD, WIDE], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_moe_experts_tilings(config, shape, dtype, poisoned):
    """Several K steps per program (H, I split into blocks), partial last blocks, tiles past the edge."""
    from ninfer.ops.triton.moe_decode import DecodeConfig
    _check_routed(shape, dtype, 3, True, seed=11, config=DecodeConfig(*config))


# (up_bn, up_bk, up_warps, down_bn, down_bk, down_warps): several blocks over H, one (and a masked one),
# rows past I; the down kernel's one K block (down_bk >= I) and its K loop (down_bk < I here, or a
# [KB, 4, BK] tile capped under I = 512 on the A3B shape).
MORE_TILINGS = [(8, 32, 4, 2, 16, 4), (4, 16, 2, 2, 64, 4), (16, 128, 4, 4, 512, 4), (1, 1024, 4, 2, 512, 4),
                (2, 32, 4, 2, 16, 4), (8, 256, 4, 4, 512, 4)]


@pytest.mark.parametrize("config", MORE_TILINGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("shape", [ODD, WIDE] + ([] if _INTERPRET else [A3B]), ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 2, 3])
def test_route_moe_experts_more_tilings(config, shape, dtype, T, poisoned):
    """Decode tiles against the reference and the routing kernel apart. T = 1 routes inside the gate|up
    kernel, T >= 2 in its own kernel first. At T = 1 also from a given routing (`moe_experts`)."""
    from ninfer.ops.triton.moe_decode import DecodeConfig
    _check_routed(shape, dtype, T, True, seed=40 + T, config=DecodeConfig(*config))
    if T == 1:
        _check_experts(shape, dtype, T, True, seed=50, config=DecodeConfig(*config))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("with_shared", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 65, 500, 2048] if not _INTERPRET else [1, 65, 1100])   # BM=128 from 64 rows per expert
def test_moe_experts_prefill(shape, with_shared, dtype, T, monkeypatch):
    from ninfer.ops.triton import moe as fm
    skip_bf16_dot(dtype)
    monkeypatch.setattr(fm, "MAX_PAIRS", 0)                   # the grouped GEMM for every T
    _check_experts(shape, dtype, T, with_shared, seed=100 + T)


@pytest.mark.parametrize("T,E,k,BM", [(1, 16, 4, 64), (65, 16, 4, 64), (300, 256, 8, 64), (2100, 256, 8, 128),
                                        (129, 5, 3, 64)] + ([] if _INTERPRET else [(8192, 256, 8, 128)]))
@pytest.mark.parametrize("skew", [False, True])
@pytest.mark.parametrize("chunk,warps,chunked", [(4096, 8, False), (1024, 4, False), (0, 0, True)],
                         ids=["scan4096", "scan1024", "chunked"])
def test_sort_pairs_is_a_stable_sort_with_a_block_table(T, E, k, BM, skew, chunk, warps, chunked, poisoned):
    """`sort_pairs` == torch.sort(stable) of the flat ids (order, tokens, weights), starts == the experts'
    first sorted rows, and the block table names every sorted row exactly once, in blocks of at most BM
    rows of one expert at the rows `_block_rows` derives; every other block is surplus (E). Skewed: most
    pairs on three experts (several blocks each), many experts unused. Both sorts: the one-launch scan
    (chunk, warps) and the chunked one (histograms, then the scatter; T=8192 x 8 fills its 64 chunks)."""
    from ninfer.ops.triton import moe_prefill as fm
    if chunked:
        assert fm.chunked_sort_ok(T * k, E)
    g = gen(11 + T)
    logits = randn(T, E, g=g)
    if skew:
        logits[:, :3] += 20.0
    ids = torch.topk(logits, k, dim=-1).indices
    if skew:
        ids = ids[torch.randperm(T, generator=torch.Generator().manual_seed(T)).to(_DEV)]
    weights = randn(T, k, dtype=torch.bfloat16, g=g)
    if chunked:
        starts, table, order, tok, w = fm.sort_pairs(ids, weights, E, BM, chunked=True)
    else:
        starts, table, order, tok, w = fm.sort_pairs(ids, weights, E, BM, chunk=chunk, warps=warps, chunked=False)
    flat = ids.reshape(-1)
    want_e, want_order = torch.sort(flat, stable=True)
    assert torch.equal(order, want_order)
    assert torch.equal(tok, want_order // k)
    assert torch.equal(w, weights.reshape(-1)[want_order])
    want_starts = torch.searchsorted(want_e, torch.arange(E + 1, device=_DEV, dtype=want_e.dtype))
    assert torch.equal(starts.long(), want_starts)
    P = T * k
    assert table.shape == (E + P // BM,)
    covered = torch.zeros(P, dtype=torch.int64)
    st, tb = starts.cpu().long(), table.cpu().long()
    for b, e in enumerate(tb.tolist()):
        assert 0 <= e <= E
        if e == E:
            continue
        row0 = int(st[e]) + (b - e - int(st[e]) // BM) * BM
        end = min(row0 + BM, int(st[e + 1]))
        assert int(st[e]) <= row0 < end, (b, e, row0, end)
        covered[row0:end] += 1
    assert torch.equal(covered, torch.ones(P, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_experts_prefill_chunks_and_skewed_routing(dtype, monkeypatch):
    """Chunked passes equal one pass; experts with many rows (several row blocks) and unused experts."""
    from ninfer.ops.triton import moe as fm
    skip_bf16_dot(dtype)
    E, k, H, I, Is = ODD
    g = gen(7)
    T = 150
    x = randn(T, H, dtype=dtype, g=g)
    gate_up, down = experts(ODD, dtype, g)
    logits = randn(T, E, dtype=dtype, g=g)
    logits[:, :k] += 20.0                                       # most tokens pick experts 0..k-1
    logits[:, E - 3:] -= 50.0                                   # never picked
    routing = ref.route_topk(logits, k)
    want = ref.moe_experts(x, routing, gate_up, down)
    one = fm.moe_experts(x, routing, gate_up, down)
    from ninfer.ops.triton import moe_prefill
    monkeypatch.setattr(moe_prefill, "PREFILL_CHUNK", 64)
    chunked = fm.moe_experts(x, routing, gate_up, down)
    assert rel_rms(one, want) < TOL[dtype] and rel_rms(chunked, want) < TOL[dtype]
    assert rel_rms(chunked, one) < TOL[dtype] / 4              # the same per-row math, any chunking


@pytest.mark.skipif(_DEV != "cuda", reason="CUDA graphs")
@pytest.mark.parametrize("T", [1, 8, 65])
@pytest.mark.parametrize("fused", [False, True])
def test_moe_graph_capture_has_no_host_sync(T, fused):
    """route_topk + moe_experts captured in a CUDA graph (a host sync would fail the capture) and
    replayed on new inputs == eager."""
    from ninfer.ops.triton import moe as fm
    E, k, H, I, Is = A3B
    dtype = torch.bfloat16
    g = gen(5)
    gate_up, down = experts(A3B, dtype, g)
    sd = randn(H, Is, dtype=dtype, g=g, scale=Is ** -0.5)
    x = randn(T, H, dtype=dtype, g=g)
    y = randn(T, 2 * Is + 1 + E, dtype=dtype, g=g)

    def step():
        shared = SharedExpert(y[:, :2 * Is], y[:, 2 * Is:2 * Is + 1], sd)
        if fused:
            return fm.route_moe_experts(x, y[:, 2 * Is + 1:], k, gate_up, down, shared=shared)
        return fm.moe_experts(x, fm.route_topk(y[:, 2 * Is + 1:], k), gate_up, down, shared=shared)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()                                                  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    x.copy_(randn(T, H, dtype=dtype, g=g))
    y.copy_(randn(T, 2 * Is + 1 + E, dtype=dtype, g=g))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, step(), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# the SparseMoE leaf: fast routing + experts vs the reference op set
# ------------------------------------------------------------------------------------------------
def _leaf_weights(shape, dtype, g, pad=0):
    """pad: zero rows after shared_in's parts (model_view pads it to a multiple of 8 rows)."""
    E, k, H, I, Is = shape
    gate_up, down = experts(shape, dtype, g)
    shared_in = torch.cat([randn(2 * Is, H, dtype=dtype, g=g, scale=H ** -0.5),
                           randn(1, H, dtype=dtype, g=g, scale=H ** -0.5),
                           randn(E, H, dtype=dtype, g=g, scale=3 * H ** -0.5),
                           torch.zeros(pad, H, dtype=dtype, device=_DEV)])
    return {"shared_in.weight": shared_in, "shared_expert.gate_proj.weight": shared_in[:Is],
            "shared_expert.down_proj.weight": randn(H, Is, dtype=dtype, g=g, scale=Is ** -0.5),
            "experts.gate_up_proj": gate_up, "experts.down_proj": down}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [1, 5, 200])
@pytest.mark.parametrize("pad", [0, 7])
def test_sparse_moe_leaf_fast_vs_reference(shape, dtype, N, pad):
    import dataclasses

    from ninfer.ops.triton import moe as fm
    from ninfer.ops.opset import reference_ops
    from ninfer.targets.qwen3_6_35b_a3b import DIMS
    from ninfer.targets.qwen3_6.layers.moe import SparseMoE
    E, k, H, I, Is = shape
    if N * k > fm.MAX_PAIRS:
        skip_bf16_dot(dtype)
    g = gen(21)
    mlp = _leaf_weights(shape, dtype, g, pad)
    h = randn(N, H, dtype=dtype, g=g)
    leaf = SparseMoE(dataclasses.replace(DIMS, num_experts=E, num_experts_per_tok=k))
    ops_ref = reference_ops()
    ops_fast = ops_ref._replace(route_topk=fm.route_topk, moe_experts=fm.moe_experts,
                                route_moe_experts=fm.route_moe_experts)
    poison_allocator()
    out = leaf(mlp, h, ops_fast)
    want = leaf(mlp, h, ops_ref)
    assert out.dtype == dtype and out.shape == h.shape
    # NOTE: a tie at the k-th probability selects different experts (both correct); compare the rest
    keep = ~boundary_ties(F.linear(h, mlp["shared_in.weight"])[:, 2 * Is + 1:2 * Is + 1 + E], k)
    assert keep.float().mean() > 0.7
    assert rel_rms(out[keep], want[keep]) < ROUTED_TOL[dtype]         # TOL on the GPU (the interpreter's bf16)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [5, 200])
def test_sparse_moe_leaf_folds_the_residual_in_its_combine(shape, dtype, N):
    """At prefill sizes the fast leaf adds its output into the residual stream in the combine, in place:
    Residual(h, None) with h the residual's own storage, bitwise the add_rms_norm add of the plain output
    (one rounding of residual + output). At decode sizes the plain output comes back and the residual is
    untouched. Given NormedRows (the mixer folded its add), the leaf
    norms them itself: the same output as the normed tensor."""
    import dataclasses

    from ninfer.ops.triton import moe as fm
    from ninfer.ops.opset import reference_ops
    from ninfer.ops.reference.fused import NormedRows, Residual
    from ninfer.targets.qwen3_6_35b_a3b import DIMS
    from ninfer.targets.qwen3_6.layers.moe import SparseMoE
    E, k, H, I, Is = shape
    if N * k > fm.MAX_PAIRS:
        skip_bf16_dot(dtype)
    g = gen(31)
    mlp = _leaf_weights(shape, dtype, g)
    raw = randn(N, H, dtype=dtype, g=g)
    nw = randn(H, dtype=dtype, g=g, scale=0.1)
    r0 = randn(N, H, dtype=dtype, g=g)
    leaf = SparseMoE(dataclasses.replace(DIMS, num_experts=E, num_experts_per_tok=k))
    ops = reference_ops()._replace(route_topk=fm.route_topk, moe_experts=fm.moe_experts,
                                   route_moe_experts=fm.route_moe_experts)
    h = ops.add_rms_norm(raw, None, nw, 1e-6)[0]
    plain = leaf(mlp, h, ops)
    assert not isinstance(plain, Residual)
    r = r0.clone()
    out = leaf(mlp, NormedRows(raw, nw, 1e-6), ops, residual=r)
    if N * k > fm.MAX_PAIRS:
        assert isinstance(out, Residual) and out.parts is None and out.h.data_ptr() == r.data_ptr()
        assert torch.equal(out.h, (r0.float() + plain.float()).to(dtype))
    else:
        assert not isinstance(out, Residual) and torch.equal(r, r0) and torch.equal(out, plain)
