"""Compile the decode GEMV kernel (ninfer/ops/fast/gemv.py) for sm_90 without a GPU, with the ptxas and
cuobjdump that Triton's wheel carries, and print each variant's registers, stack and local memory
(spills). Registers bound the programs per SM (65536 / (regs x 32 x warps)), so they are the first
thing to read for a variant that adds loads in flight.

    PYTHONPATH=<triton 3.6>:$PWD python3 bench/gemv_sm90.py
"""
from __future__ import annotations

import os
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer.ops.fast import gemv as G

# mode name -> the constexprs that differ from BASE (tiles of the 27B's M=1 table unless noted)
VARIANTS = {
    "plain 8x512": dict(BLOCK_N=8, BLOCK_K=512),
    "prefetch": dict(BLOCK_N=8, BLOCK_K=512, PREFETCH=True),
    "prefetch+norm": dict(BLOCK_N=8, BLOCK_K=512, PREFETCH=True, NORM=True, BP=1024),
    "prefetch+resid 8x1024": dict(BLOCK_N=8, BLOCK_K=1024, RESID=True, PREFETCH=True),
    "swiglu+resid": dict(BLOCK_N=8, BLOCK_K=512, SWIGLU=True, RESID=True),
    "dot split 32x128": dict(BLOCK_N=32, BLOCK_K=128, DOT=True, M_PAD=16, SPLIT=True),
}
BASE = dict(M_PAD=1, SPLIT=False, DOT=False, EVEN_K=True, PREC="tf32", SWIGLU=False, RESID=False, NORM=False, BP=1,
            PREFETCH=False, PDL=True)
_TYPES = {"ws_ptr": "*fp32", "cnt_ptr": "*i32", "parts_ptr": "*fp32", "eps": "fp32"}


def arg_type(name: str) -> str:
    return _TYPES.get(name, "*bf16" if name.endswith("_ptr") else "i32")


def main() -> None:
    kernel = G._gemv_kernel
    order = kernel.arg_names
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for name, v in VARIANTS.items():
        cx = dict(BASE, **v)
        sig = {a: ("constexpr" if a in cx else arg_type(a)) for a in order}
        src = ASTSource(fn=kernel, signature=sig, constexprs={(order.index(k),): val for k, val in cx.items()})
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
        except Exception as e:  # noqa: BLE001 - report the variant that does not compile, try the rest
            print(f"{name:26s} FAILED {type(e).__name__}: {str(e)[-300:]}")
            continue
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        usage = next((ln.strip() for ln in out.splitlines() if "REG" in ln), "(no resource line)")
        print(f"{name:26s} ok  {usage}")


if __name__ == "__main__":
    main()
