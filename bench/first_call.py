"""First-call cost of the library ops a prefill stage runs at a new token count (no Triton involved):
causal GQA SDPA per backend (cuDNN plans are built per shape); `padded_causal_sdpa` at fresh lengths
that share a padded length; a chunk over a prefix (the lower-right mask, as `chunk_paged_attention`
calls it) at fresh (chunk, context) pairs; F.linear (cuBLAS) at a new row count. For each backend and each fresh length: the first call, the second
call (both synchronised wall times) and the steady time (`bench_ms`: do_bench's median).

    PYTHONPATH=$PWD python3 bench/first_call.py
"""
from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ninfer.bench.common import bench_ms


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    dev = "cuda"
    torch.manual_seed(0)
    rows = []
    backends = {"default": None, "flash": [SDPBackend.FLASH_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION],
                "efficient": [SDPBackend.EFFICIENT_ATTENTION]}
    # (Hq, Hkv, D): 35B-A3B and 27B attention layers; lengths fresh per backend (no plan shared)
    for name, bk in backends.items():
        for hq, hkv, d in [(16, 2, 256), (24, 4, 256)]:
            for L in [1001, 3001, 8001]:
                L += 2 * list(backends).index(name) + (0 if hq == 16 else 20)
                q = torch.randn(1, hq, L, d, device=dev, dtype=torch.bfloat16)
                k = torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16)
                v = torch.randn_like(k)

                def run():
                    if bk is None:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    with sdpa_kernel(bk):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                try:
                    first, second, st = timed(run), timed(run), bench_ms(run)
                except RuntimeError as e:
                    print(f"sdpa {name:9s} Hq {hq} Hkv {hkv} L {L}: {str(e).splitlines()[0][:100]}")
                    rows.append(dict(op="sdpa", backend=name, hq=hq, hkv=hkv, L=L, error=str(e)[:200]))
                    break
                print(f"sdpa {name:9s} Hq {hq} Hkv {hkv} L {L:5d}: first {first:8.2f} ms, second {second:7.2f}, "
                      f"steady {st:7.3f}")
                rows.append(dict(op="sdpa", backend=name, hq=hq, hkv=hkv, L=L, first_ms=first, second_ms=second,
                                 steady_ms=st))
    from torch.nn.attention.bias import causal_lower_right
    from ninfer.ops.reference.attention import padded_causal_sdpa, sdpa_rows
    for L in [1001, 1003, 1017, 3001, 3007, 7001, 7003]:               # 1024, 1024, 1024, 3072, 3072, 7168, 7168
        q = torch.randn(L, 16, 256, device=dev, dtype=torch.bfloat16)
        k = torch.randn(L, 2, 256, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        run = lambda: padded_causal_sdpa(q, k, v, 256 ** -0.5)  # noqa: E731
        first, second, st = timed(run), timed(run), bench_ms(run)
        print(f"padded   Hq 16 Hkv 2 L {L:5d} (rows {sdpa_rows(L)}): first {first:8.2f} ms, second {second:7.2f}, "
              f"steady {st:7.3f}")
        rows.append(dict(op="padded_sdpa", L=L, rows=sdpa_rows(L), first_ms=first, second_ms=second, steady_ms=st))
    for L, C in [(500, 1700), (501, 1703), (4000, 8100)]:
        q = torch.randn(1, 16, L, 256, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, 2, C, 256, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        run = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, C),  # noqa: E731
                                                     enable_gqa=True)
        first, second, st = timed(run), timed(run), bench_ms(run)
        print(f"prefix   Hq 16 Hkv 2 L {L:5d} C {C}: first {first:8.2f} ms, second {second:7.2f}, steady {st:7.3f}")
        rows.append(dict(op="prefix_sdpa", L=L, C=C, first_ms=first, second_ms=second, steady_ms=st))
    w = torch.randn(1288, 2048, device=dev, dtype=torch.bfloat16)
    for M in [1003, 3005, 8007]:
        x = torch.randn(M, 2048, device=dev, dtype=torch.bfloat16)
        first, second, st = timed(lambda: F.linear(x, w)), timed(lambda: F.linear(x, w)), bench_ms(lambda: F.linear(x, w))
        print(f"linear M {M:5d} x 2048 -> 1288: first {first:8.2f} ms, second {second:7.2f}, steady {st:7.3f}")
        rows.append(dict(op="linear", M=M, first_ms=first, second_ms=second, steady_ms=st))
    print("JSON " + json.dumps(dict(bench="first_call", torch=torch.__version__,
                                    cudnn=torch.backends.cudnn.version(), rows=rows)))


if __name__ == "__main__":
    main()
