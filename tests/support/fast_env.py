"""Shared setup of the fast-kernel test files (`tests/gpu/test_*_gpu.py` for Triton kernels).

They run on the GPU machine (`pytest -m gpu`) and are skipped without CUDA. With TRITON_INTERPRET=1
and NINFER_FAST_TEST_DEVICE=cpu the kernels run through Triton's CPU interpreter instead (slow; bf16
rounding there is towards zero, hence STRICT)."""
from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("NINFER_FAST_TEST_DEVICE", "cuda")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and DEV == "cpu"
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA"),
]
# NOTE: Triton's interpreter rounds fp32 -> bf16 towards zero (the GPU rounds to nearest even), so
#       the tighter element-wise bounds only hold on the GPU.
STRICT = 1 if INTERPRET else 4


def gen(seed: int) -> torch.Generator:
    """A seeded generator on the test device."""
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    return g


def randn(*shape, dtype=torch.float32, g=None, scale=1.0) -> torch.Tensor:
    """Normal samples drawn in fp32 on the test device, scaled, then cast to dtype."""
    return (torch.randn(*shape, generator=g, device=DEV, dtype=torch.float32) * scale).to(dtype)


def poison_allocator() -> None:
    """Fill free cached CUDA memory with NaN so that outputs not fully written show up."""
    if DEV == "cuda":
        t = torch.full((64 << 20,), float("nan"), dtype=torch.float32, device="cuda")
        del t


def paged_kv(lens, Hkv, D, page, dtype, g, extra_pages=3):
    """NaN-filled K/V page pools [P, page, Hkv, D] with each row's L tokens (random) written through the
    reference op to a random permutation of pages; block tables [rows, max pages + 1] int32 whose
    padding entries point at a NaN page. Returns (k_cache, v_cache, block_tables) on the test device."""
    from ninfer.ops.reference.attention import write_kv_paged
    need = [(L + page - 1) // page for L in lens]
    P = sum(need) + extra_pages
    perm = torch.randperm(P, generator=torch.Generator().manual_seed(0)).tolist()
    bt = torch.zeros(len(lens), max(need) + 1, dtype=torch.int32)
    kc = torch.full((P, page, Hkv, D), float("nan"), dtype=dtype, device=DEV)
    vc = torch.full_like(kc, float("nan"))
    i = 0
    for b, L in enumerate(lens):
        pages = perm[i:i + need[b]]
        i += need[b]
        bt[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        bt[b, len(pages):] = perm[-1]
        k = randn(L, Hkv, D, dtype=dtype, g=g)
        v = randn(L, Hkv, D, dtype=dtype, g=g)
        write_kv_paged(kc, vc, k, v, bt[b:b + 1].to(DEV), torch.arange(L, device=DEV))
    return kc, vc, bt.to(DEV)
