"""Compile decode kernels for sm_90 without a GPU, with the ptxas and cuobjdump that Triton's wheel
carries, and print each variant's registers, stack and local memory (spills): the GEMV
(ninfer/ops/triton/gemv.py), the GDN decode step (gdn_decode.py, 27B heads), the MoE expert kernels
(moe.py, 35B-A3B tiles), the paged decode attention (attention.py, 35B-A3B heads) and the q/k norm +
rotary with and without the paged KV write (fused.py, 27B heads).
Registers bound the programs per SM (65536 / (regs x 32 x warps)), so they are the first thing to
read for a variant that adds loads in flight.

    PYTHONPATH=<triton 3.6>:$PWD python3 bench/kernels_sm90.py
"""
from __future__ import annotations

import os
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ninfer.ops.triton import attention as A
from ninfer.ops.triton import fused as F
from ninfer.ops.triton import gdn_decode as D
from ninfer.ops.triton import gemv as G
from ninfer.ops.triton import moe as M

# mode name -> the constexprs that differ from BASE (tiles of the 27B's M=1 table unless noted)
GEMV_VARIANTS = {
    "plain 8x512": dict(BLOCK_N=8, BLOCK_K=512),
    "prefetch": dict(BLOCK_N=8, BLOCK_K=512, PREFETCH=True),
    "prefetch+norm": dict(BLOCK_N=8, BLOCK_K=512, PREFETCH=True, NORM=True, BP=1024),
    "prefetch+resid 8x1024": dict(BLOCK_N=8, BLOCK_K=1024, RESID=True, PREFETCH=True),
    "swiglu+resid": dict(BLOCK_N=8, BLOCK_K=512, SWIGLU=True, RESID=True),
    "dot split 32x128": dict(BLOCK_N=32, BLOCK_K=128, DOT=True, M_PAD=16, SPLIT=True),
}
GEMV_BASE = dict(M_PAD=1, SPLIT=False, DOT=False, EVEN_K=True, PREC="tf32", SWIGLU=False, RESID=False, NORM=False,
                 BP=1, PREFETCH=False, PDL=True)
# MoE decode at T=1 (DECODE_CONFIG): gate|up [8, 1, 1024] tiles, down [8, 2, 512]
UP_BASE = dict(TOPK=8, KB=8, ROUTE=True, BE=256, BN=1, BK=1024, EVEN=True, PDL=True)
UP_VARIANTS = {"moe gate|up route": {}, "moe gate|up route 8x1x512": dict(BK=512)}
DOWN_BASE = dict(TOPK=8, KB=8, HAS_SHARED=True, BN=2, BK=512, EVEN=True, ONE_BLOCK=True, EARLY=False, PDL=True)
DOWN_VARIANTS = {"moe down": {}, "moe down (as a loop)": dict(ONE_BLOCK=False),
                 "moe down, early loads": dict(EARLY=True)}
# GDN decode state step, 27B heads (H=16, HV=48, K=V=128), BV=16 (B=1)
GDN_BASE = dict(H=16, HV=48, K=128, V=128, BK=128, BV=16, EARLY=True, PDL=True)
GDN_VARIANTS = {"gdn conv+recurrent": {}, "gdn conv+recurrent, loads after the wait": dict(EARLY=False)}
# paged decode attention at the 35B-A3B heads (16 q, 2 kv, 256): the split kernel and the merge
ATTN_SPLIT = dict(HQ=16, REP=8, D=256, PAGE=64, BH=16, BN=32, PREC="tf32", PDL=True)
ATTN_MERGE = dict(HQ=16, D=256, BN=32, BS=16, HAS_GATE=False, PDL=True)
# q/k norm + rotary at the 27B heads (24 q, 4 kv, 256, rot 64): HB = 8 heads per program
QK_BASE = dict(WRITE_KV=False, HAS_ROWS=False, HB=8, BD=256, VB=1, PDL=True)
QK_VARIANTS = {"qk norm rope": {}, "qk norm rope + kv write": dict(WRITE_KV=True, HAS_ROWS=True)}
_TYPES = {"ws_ptr": "*fp32", "cnt_ptr": "*i32", "parts_ptr": "*fp32", "eps": "fp32", "ids": "*i64",
          "part_o": "*fp32", "part_ml": "*fp32", "lens": "*i64", "bt": "*i32", "cos": "*fp32", "sin": "*fp32",
          "pos": "*i64", "rows": "*i64"}
_GDN_TYPES = {"state": "*fp32", "src": "*i64", "dst": "*i64", "scale": "fp32"}
_MOE_PTRS = {"conv", "a", "b", "A_log", "dt_bias", "o", "x", "logits", "rw", "w", "act", "down", "out", "sgu", "sg",
             "sdown"}
_ATTN_PTRS = {"q", "k", "v", "kc", "vc", "wq", "wk", "qo", "ko", "gate"}


def arg_type(name: str) -> str:
    if name in _TYPES or name in _GDN_TYPES:
        return _TYPES.get(name) or _GDN_TYPES[name]
    return "*bf16" if name.endswith("_ptr") or name in _MOE_PTRS | _ATTN_PTRS else "i32"


def divisible(name: str, ty: str) -> bool:
    """What the JIT sees at the model's shapes: pointers 16-byte aligned and the integer arguments (sizes,
    strides) multiples of 16, which Triton's launcher specialises on."""
    return ty.startswith("*") or ty == "i32"


def compile_report(kernel, name: str, cx: dict, num_warps: int, hints: bool = True) -> None:
    """hints: mark the pointers and integers divisible by 16 as Triton's launcher does for such values
    (without them the weight loads compile to 2-byte loads and the register counts are not the real ones)."""
    order = kernel.arg_names
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sig = {a: ("constexpr" if a in cx else arg_type(a)) for a in order}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(order)
             if hints and a not in cx and divisible(a, sig[a])}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(order.index(k),): val for k, val in cx.items()},
                    attrs=attrs)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 1})
    except Exception as e:  # noqa: BLE001 - report the variant that does not compile, try the rest
        print(f"{name:26s} FAILED {type(e).__name__}: {str(e)[-300:]}")
        return
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    usage = next((ln.strip() for ln in out.splitlines() if "REG" in ln), "(no resource line)")
    print(f"{name:26s} ok  {usage}")


def main() -> None:
    for name, v in GEMV_VARIANTS.items():
        compile_report(G._gemv_kernel, name, dict(GEMV_BASE, **v), 4)
    for name, v in GDN_VARIANTS.items():
        compile_report(D._gdn_conv_recurrent_kernel, name, dict(GDN_BASE, **v), 4)
    for name, v in UP_VARIANTS.items():
        compile_report(M._experts_gate_up_kernel, name, dict(UP_BASE, **v), M.DECODE_CONFIG.up_warps)
    for name, v in DOWN_VARIANTS.items():
        compile_report(M._experts_down_kernel, name, dict(DOWN_BASE, **v), M.DECODE_CONFIG.down_warps)
    compile_report(A._paged_decode_kernel, "attn decode split", ATTN_SPLIT, 4)
    compile_report(A._merge_kernel, "attn decode merge", ATTN_MERGE, 4)
    compile_report(A._merge_kernel, "attn decode merge + gate", dict(ATTN_MERGE, HAS_GATE=True), 4)
    for name, v in QK_VARIANTS.items():
        compile_report(F._qk_norm_rope_kernel, name, dict(QK_BASE, **v), 8)


if __name__ == "__main__":
    main()
