"""Decode step time through the Program, B = 1..8 at context 1k and 8k, real sizes with synthetic
(dummy) weights, bf16, with the decode CUDA graphs off (eager) and on (column `graphs`).

    PYTHONPATH=$PWD python bench/decode.py [--identity qwen3_6-27b qwen3_6-35b-a3b] [--ctx 1024 8192]
        [--batches 1 2 4 8] [--prefill-ref-gdn] [--host-overhead]

--prefill-ref-gdn prefills with the PyTorch chunk delta rule instead of fla-core's (skips fla's
first-call compile and autotuning, tens of seconds; the decode steps are unaffected).
--host-overhead: the tiny dense identity on the GPU (fp32), B = 1, 4, 8: wall time of a round,
the Python thread's CPU time per round (time.thread_time) and the GPU time of the forward alone
(graph replays timed with CUDA events); host overhead = round - GPU forward time.

One decode round = `Program.decode(rows)` (state image copy into the provisional entry, the
forward, lm_head, sampling, one host sync for the token ids) followed by `abort_pending`, so every
round runs at the same context. Host wall clock around each round, median of 10 after 3 warm-ups.
Also the prefill time of each prompt (its median over the rows) and, at 1k, the same rounds with
the reference ops for comparison. Floor = bytes read per step / copy bandwidth measured in this
run: weights read once (MoE: the distinct experts B rows can touch, at most min(E, k*B) per layer,
plus router, shared expert and attention/GDN), plus per row the KV of its context and the GDN
recurrent state read + written, plus the Program's slot -> provisional state copy (read + write).
"""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import env_record, json_line, measure_ceilings, print_ceilings, print_table  # noqa: E402
from ninfer.ops.fast import reference_ops  # noqa: E402
from ninfer.runtime.contract.types import SamplingParams, SequenceRequest  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.runtime.config import ProgramConfig  # noqa: E402

PAGE = 64


def weight_bytes(view, batch: int) -> int:
    """Bytes of weights one decode step reads at `batch` rows (one embedding row per row)."""
    d = view.dims
    total = view.lm_head.numel() * view.lm_head.element_size() + view.norm.numel() * view.norm.element_size()
    total += batch * d.hidden_size * view.embed_tokens.element_size()
    for layer in view.layers:
        for t in (layer.input_norm, layer.post_norm, *vars(layer.mixer).values()):
            total += t.numel() * t.element_size()
        for name, t in layer.mlp.items():
            nb = t.numel() * t.element_size()
            if name.startswith("experts."):
                nb = nb * min(d.num_experts, d.num_experts_per_tok * batch) // d.num_experts
            total += nb
    return total


def per_row_bytes(dims, ctx: int, dtype_bytes: int = 2) -> int:
    kv = len(dims.attention_layers) * ctx * dims.num_key_value_heads * dims.head_dim * 2 * dtype_bytes
    rec = len(dims.gdn_layers) * dims.linear_num_value_heads * dims.linear_key_head_dim * dims.linear_value_head_dim * 4
    conv = len(dims.gdn_layers) * dims.conv_dim * (dims.linear_conv_kernel_dim - 1) * dtype_bytes
    # recurrent + conv state: read and written by the kernels, and copied slot -> provisional (read + write)
    return kv + 4 * (rec + conv)


def run_identity(identity: str, ctxs: list[int], bw: float, reps: int, ref_compare: bool, device: str = "cuda",
                 batches: list[int] = list(range(1, 9)), prefill_ref_gdn: bool = False) -> list[dict]:
    w = DummyWeights(identity, device=device, dtype=torch.bfloat16, seed=0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    pkg = importlib.import_module(w.package.module)
    dims = w.dims
    max_ctx = max(ctxs)
    pages = sum(8 * (c // PAGE + 2) for c in ctxs) + 16
    cfg = ProgramConfig(device=device, dtype="bf16", page_size=PAGE, num_pages=pages, num_slots=8 * len(ctxs),
                        max_model_len=max_ctx + 64, max_batch=8, max_steps=1)
    t0 = time.perf_counter()
    prog = pkg.create_program(w, cfg)
    sync()
    load_s = time.perf_counter() - t0
    cap = prog.graphs.capture_s if prog.graphs is not None else 0.0
    print(f"[{identity}] synthetic weights generated and Program created in {load_s:.1f} s "
          f"(of which decode graph capture B=1..8: {cap:.1f} s); ops={prog.model.ops.name}; GPU memory {(torch.cuda.memory_allocated() if device == 'cuda' else 0) / 2**30:.1f} GiB", flush=True)
    rng = torch.Generator().manual_seed(0)
    out = []
    main_ops = prog.model.ops
    for ctx in ctxs:
        handles, pre_ms = [], []
        if prefill_ref_gdn:
            prog.model.ops = main_ops._replace(chunk_gated_delta_rule=reference_ops().chunk_gated_delta_rule)
        for r in range(8):
            prompt = tuple(torch.randint(0, dims.vocab_size, (ctx,), generator=rng).tolist())
            req = SequenceRequest(prompt_token_ids=prompt, max_output_tokens=32,
                                  sampling=SamplingParams(temperature=0.0))
            h = prog.start_materialize(prog.plan_materialize(req)).sequence
            sync()
            t0 = time.perf_counter()
            step = prog.prefill(h, ctx)
            sync()
            pre_ms.append((time.perf_counter() - t0) * 1e3)
            prog.commit(step.pending, [1])
            handles.append(h)
        prog.model.ops = main_ops
        pflops = 2 * sum(p.numel() for p in _matrices(prog.model.view)) * ctx
        print(f"[{identity}] ctx {ctx}: prefill ms per prompt {[round(x, 1) for x in pre_ms]}", flush=True)
        out.append(dict(identity=identity, kind="prefill", ctx=ctx, first_ms=pre_ms[0],
                        median_ms=statistics.median(pre_ms[1:]), gemm_flops=pflops))
        variants = [(main_ops.name, main_ops, False)]
        if prog.graphs is not None:
            variants.append((main_ops.name, main_ops, True))
        if ref_compare and ctx == min(ctxs):
            variants.append(("reference", reference_ops(), False))
        for name, ops, graphs in variants:
            prog.model.ops = ops
            prog.graphs_enabled = graphs
            for B in batches:
                if name == "reference" and B not in (1, 8):
                    continue
                hs = handles[:B]
                times = []
                for i in range(3 + reps):
                    sync()
                    t0 = time.perf_counter()
                    batch = prog.decode(hs)
                    sync()
                    dt = time.perf_counter() - t0
                    prog.abort_pending(batch)
                    if i >= 3:
                        times.append(dt * 1e3)
                floor_ms = (weight_bytes(prog.model.view, B) + B * per_row_bytes(dims, ctx)) / bw * 1e3
                out.append(dict(identity=identity, kind="decode", ops=name, graphs=graphs, ctx=ctx, batch=B,
                                step_ms=statistics.median(times), min_ms=min(times), floor_ms=floor_ms))
                print(f"[{identity}] {name} graphs={graphs} ctx {ctx} B={B}: {statistics.median(times):.2f} ms "
                      f"(min {min(times):.2f}, floor {floor_ms:.2f})", flush=True)
            prog.model.ops = main_ops
            prog.graphs_enabled = True
    del prog, w
    gc.collect()
    torch.cuda.empty_cache()
    return out


def host_overhead(reps: int = 50) -> list[dict]:
    """Tiny dense identity on the GPU: per decode round, wall time, thread CPU time and the GPU
    time of the forward alone, graphs on and off."""
    from ninfer.targets.qwen3_6_tiny_dense import create_program
    w = DummyWeights("qwen3_6-tiny-dense", device="cuda", dtype=torch.float32, seed=0)
    prog = create_program(w, ProgramConfig(device="cuda", dtype="fp32", page_size=16, num_pages=256, num_slots=8,
                                           max_model_len=1024, max_batch=8, max_steps=1))
    handles = []
    for r in range(8):
        req = SequenceRequest(prompt_token_ids=tuple(range(1 + r, 9 + r)), max_output_tokens=32,
                              sampling=SamplingParams(temperature=0.0))
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        while True:
            st = prog.prefill(h, 1)           # 1-token stages: decode kernels, no fla compile
            if st.pending is not None:
                prog.commit(st.pending, [1])
                break
        handles.append(h)
    out = []
    for graphs in (False, True):
        prog.graphs_enabled = graphs
        for B in (1, 4, 8):
            hs = handles[:B]
            walls, cpus = [], []
            for i in range(10 + reps):
                torch.cuda.synchronize()
                c0, t0 = time.thread_time(), time.perf_counter()
                batch = prog.decode(hs)
                prog.abort_pending(batch)
                torch.cuda.synchronize()
                if i >= 10:
                    walls.append((time.perf_counter() - t0) * 1e3)
                    cpus.append((time.thread_time() - c0) * 1e3)
            gpu_ms = float("nan")
            if graphs:
                gr = prog.graphs._graphs[B].graph
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                gr.replay()
                e0.record()
                for _ in range(20):
                    gr.replay()
                e1.record()
                torch.cuda.synchronize()
                gpu_ms = e0.elapsed_time(e1) / 20
            wall = statistics.median(walls)
            out.append(dict(kind="host", graphs=graphs, batch=B, round_ms=wall, cpu_ms=statistics.median(cpus),
                            gpu_forward_ms=gpu_ms, host_ms=wall - gpu_ms))
            print(f"[host] graphs={graphs} B={B}: round {wall:.3f} ms, thread CPU {statistics.median(cpus):.3f} ms, "
                  f"GPU forward {gpu_ms:.4f} ms", flush=True)
    prog.graphs_enabled = True
    del prog, w
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _matrices(view):
    for layer in view.layers:
        for t in (*vars(layer.mixer).values(), *layer.mlp.values()):
            if t.dim() >= 2:
                yield t
    yield view.lm_head


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b", "qwen3_6-35b-a3b"])
    ap.add_argument("--ctx", nargs="+", type=int, default=[1024, 8192])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-ref", action="store_true")
    ap.add_argument("--batches", nargs="+", type=int, default=list(range(1, 9)))
    ap.add_argument("--prefill-ref-gdn", action="store_true")
    ap.add_argument("--host-overhead", action="store_true")
    args = ap.parse_args()
    env = env_record()
    ceil = measure_ceilings()
    print(f"env: {env}")
    print_ceilings(ceil)
    bw, peak = ceil["copy_TBps"] * 1e12, ceil["matmul_8192_TFLOPs"] * 1e12
    results = []
    if args.host_overhead:
        results += host_overhead()
    for ident in args.identity:
        results += run_identity(ident, args.ctx, bw, args.reps, not args.no_ref, batches=args.batches,
                                prefill_ref_gdn=args.prefill_ref_gdn)
    print()
    rows = [[r["graphs"], r["batch"], r["round_ms"], r["cpu_ms"], r["gpu_forward_ms"], r["host_ms"]]
            for r in results if r["kind"] == "host"]
    if rows:
        print_table(["graphs", "B", "round_ms", "thread_cpu_ms", "gpu_fwd_ms", "host_ms"], rows)
        print()
    rows = []
    for r in results:
        if r["kind"] == "decode":
            rows.append([r["identity"], r["ops"], r["graphs"], r["ctx"], r["batch"], r["step_ms"], r["floor_ms"],
                         r["step_ms"] / r["floor_ms"], 1000 * r["batch"] / r["step_ms"]])
    print_table(["identity", "ops", "graphs", "ctx", "B", "step_ms", "floor_ms", "x_floor", "tok/s"], rows)
    print()
    rows = [[r["identity"], r["ctx"], r["first_ms"], r["median_ms"], r["gemm_flops"] / peak * 1e3,
             r["median_ms"] / (r["gemm_flops"] / peak * 1e3)] for r in results if r["kind"] == "prefill"]
    print_table(["identity", "prompt", "prefill_first_ms", "prefill_median_ms", "gemm_floor_ms", "x_floor"], rows)
    json_line("decode", {"env": env, "ceilings": ceil, "dtype": "bf16", "page_size": PAGE,
                         "weights": "dummy (synthetic)", "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
