"""A guard for the CPU checks of captured regions (tests/unit/qwen3_6/test_cuda_graphs_cpu.py,
tests/unit/qwen3_6/test_prefill_graphs.py): inside `no_host_data` a host sync or a tensor built from host data
raises; `unguarded` lifts it around one op (the CPU references loop on the host; the fast CUDA ops are
checked on the GPU, where a capture fails on any sync). `dense_moe` is a sync-free stand-in for the
reference routed experts."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


class _HostSync(AssertionError):
    pass


@contextlib.contextmanager
def no_host_data():
    def banned(name):
        def f(*a, **k):
            raise _HostSync(f"{name} inside the captured region")
        return f
    saved = {}
    targets = [(torch.Tensor, n) for n in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__")]
    targets += [(torch, "tensor"), (torch, "as_tensor")]
    for obj, n in targets:
        saved[(obj, n)] = getattr(obj, n)
        setattr(obj, n, banned(n))
    try:
        yield saved
    finally:
        for (obj, n), v in saved.items():
            setattr(obj, n, v)


def unguarded(fn, saved):
    """Run one op with the guard lifted (ops are checked elsewhere)."""
    def call(*a, **k):
        cur = {key: getattr(*key) for key in saved}
        for (obj, n), v in saved.items():
            setattr(obj, n, v)
        try:
            return fn(*a, **k)
        finally:
            for (obj, n), v in cur.items():
                setattr(obj, n, v)
    return call


def dense_moe(x, routing, gate_up, down, *, shared=None):
    """Sync-free routed experts (every expert computed, weighted by a scatter of the routing), plus
    the gated shared expert when given (`ninfer.ops.reference.moe.SharedExpert`, as the reference)."""
    E, I = down.shape[0], down.shape[-1]
    w = torch.zeros(x.shape[0], E, dtype=torch.float32).scatter_(1, routing.ids, routing.weights.float())
    h = torch.einsum("th,eih->tei", x.float(), gate_up.float())
    y = torch.einsum("tei,ehi->teh", F.silu(h[..., :I]) * h[..., I:], down.float())
    out = (y * w.unsqueeze(-1)).sum(1).to(x.dtype)
    if shared is not None:
        Is = shared.down.shape[1]
        gu = shared.gate_up
        out = out + torch.sigmoid(shared.gate) * F.linear(F.silu(gu[:, :Is]) * gu[:, Is:], shared.down)
    return out


def guarded_ops(ops, saved):
    """`ops` with every op lifted out of the guard."""
    return ops._replace(**{f: unguarded(getattr(ops, f), saved) for f in ops._fields if f != "name"})
