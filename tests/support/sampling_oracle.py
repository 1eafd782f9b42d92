"""The float64 oracle of the sampling truncation (top-k, then top-p), shared by the reference-op tests
(tests/unit/ops/test_ops_sampling.py) and the fast-kernel tests (tests/gpu/test_fast_sampling_gpu.py)."""
from __future__ import annotations

import torch


def kept_oracle(x: torch.Tensor, top_k: int, top_p: float) -> tuple[set[int], bool]:
    """The ids one row keeps under steps 6-7 of `ninfer/ops/reference/sampling.py`'s docstring, in
    float64: descending values with ties by lowest id, top-k keeps values >= the k-th, top-p the prefix
    whose mass before each token is below top_p. Also whether some token's mass before lies within 1e-5
    of top_p (fp32 may round either way there)."""
    xs = x.double()
    V = xs.numel()
    order = sorted(range(V), key=lambda i: (-xs[i].item(), i))
    kept = order
    if 0 < top_k < V:
        kth = xs[order[top_k - 1]].item()
        kept = [i for i in order if xs[i].item() >= kth]
    if top_p >= 1.0:
        return set(kept), False
    p = torch.softmax(xs[kept], dim=0).tolist()
    out, before, near = [], 0.0, False
    for i, pi in zip(kept, p):
        near |= abs(before - top_p) < 1e-5
        if before >= top_p and out:
            break
        out.append(i)
        before += pi
    return set(out), near
