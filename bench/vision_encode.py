"""Vision encode time of the Qwen3.6 towers with synthetic weights: NInfer's VisionTower beside transformers'
`model.visual` (Qwen3_5(Moe)VisionModel) holding the same weights, in the same run (a developer tool).

    python3 bench/vision_encode.py [--identity qwen3_6-27b qwen3_6-35b-a3b] [--device cuda|cpu]
        [--image 1024x1024] [--video 30x448x448] [--reps 10] [--no-hf] [--no-ceilings] [--out DIR]

Media: --image HxW (pixels) and --video FxHxW (frames x pixels), sizes multiples of patch x merge (32 at the
real sizes), which the processors' smart_resize keeps as they are: an image is grid (1, H/P, W/P), a video
(F/T, H/P, W/P) with T = temporal_patch_size frames a group. Pixel values: seeded random [patches, C_in*T*P*P]
in the model dtype (bf16 on CUDA, fp32 on the CPU); the tower's time does not depend on them.

Weights: `DummyWeights` of the identity (its vision group), loaded once into NInfer's VisionView and copied into
the transformers model built from the identity's vision config (sdpa attention), so both run the same tensors.

Per identity and media: ninfer_ms and hf_ms (median over --reps calls after 2 untimed ones; CUDA events on the
GPU, wall clock on the CPU), speedup = hf / ninfer, the peak memory each call adds over what it started with
(CUDA) beside the tower's own bound of it (`activation_bytes`, what a workspace plan reserves), the rel RMS of
NInfer's output against transformers', the tower's FLOPs and their floor at the measured matmul rate. Prints a table and one JSON line (`bench`: vision_encode); --out DIR also writes
DIR/vision_encode.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from ninfer.bench.common import (Recorder, build_hf, default_device, env_record, free_model, measure_ceilings,  # noqa: E402
                                 print_ceilings, print_table, run_step)
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.vision import VisionTower, load_vision_view  # noqa: E402
from ninfer.targets.registry import lookup  # noqa: E402

MiB = 2 ** 20


def parse_size(text: str, parts: int) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        vals = ()
    if len(vals) != parts or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {'x'.join(['N'] * parts)} of positive integers")
    return vals


def media_grids(v, image: tuple[int, int] | None, video: tuple[int, int, int] | None) -> list[tuple[str, tuple]]:
    """[(label, (t, h, w))] of the requested media at the tower's patch sizes."""
    step = v.patch_size * v.spatial_merge_size
    out = []
    for label, frames, (H, W) in ([("image", 1, image)] if image else []) + \
                                 ([("video", video[0], video[1:])] if video else []):
        if H % step or W % step:
            raise ValueError(f"{label} {H}x{W}: height and width must be multiples of {step} (patch x merge)")
        if label == "video" and frames % v.temporal_patch_size:
            raise ValueError(f"video of {frames} frames: a multiple of {v.temporal_patch_size} frames is needed")
        name = f"image {H}x{W}" if label == "image" else f"video {frames}x{H}x{W}"
        out.append((name, (max(frames // v.temporal_patch_size, 1), H // v.patch_size, W // v.patch_size)))
    return out


def tower_flops(v, grid: tuple[int, int, int]) -> float:
    """Multiply-add FLOPs (x2) of the tower's GEMMs and attention for one entry."""
    t, h, w = grid
    n, L, C, I, m2 = t * h * w, h * w, v.hidden_size, v.intermediate_size, v.spatial_merge_size ** 2
    patch = n * v.in_channels * v.temporal_patch_size * v.patch_size ** 2 * C
    block = n * (3 * C * C + C * C + 2 * C * I) + 2 * t * L * L * C
    merger = n // m2 * (m2 * C * m2 * C + m2 * C * v.out_hidden_size)
    return 2.0 * (patch + v.depth * block + merger)


def time_ms(fn, reps: int, device: torch.device) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_mib(fn, device: torch.device) -> float | None:
    """The memory one call of fn adds at its peak over what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - base) / MiB


def hf_visual(dims, weights: DummyWeights, device: torch.device, dtype: torch.dtype):
    """transformers' vision model of the identity's vision config on the device in `dtype`, sdpa attention,
    holding the synthetic weights (canonical `visual.X` -> its `X`)."""
    import transformers as tf

    from ninfer.targets.qwen3_6.schema import tensor_specs
    from ninfer.testing.tiny_hf import hf_vision_config_kwargs

    cfg_cls = tf.Qwen3_5MoeVisionConfig if dims.is_moe else tf.Qwen3_5VisionConfig
    model_cls = tf.Qwen3_5MoeVisionModel if dims.is_moe else tf.Qwen3_5VisionModel
    model = build_hf(model_cls, cfg_cls(**hf_vision_config_kwargs(dims)), dtype, device)
    state = {s.name[len("visual."):]: weights.tensor(s.name) for s in tensor_specs(dims, ("vision",))}
    model.load_state_dict(state, strict=True)
    return model


def bench_identity(identity: str, media: list[tuple[int, ...]], args, device: torch.device, peak_flops: float | None,
                   on_row) -> None:
    dims = lookup(identity).dims
    if dims.vision is None:
        raise ValueError(f"{identity} has no vision tower")
    v = dims.vision
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    weights = DummyWeights(identity, device=device, dtype=dtype, seed=0)
    tower = VisionTower(load_vision_view(dims, weights, device, dtype), dims, device, dtype)
    hf = None if args.no_hf else hf_visual(dims, weights, device, dtype)
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"[{identity}] tower ({tower.attention} attention) and transformers' model.visual built in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    width = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    for label, grid in media_grids(v, *media):
        n = grid[0] * grid[1] * grid[2]
        pv = torch.randn(n, width, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
        grid_t = torch.tensor([grid], device=device)
        with torch.no_grad():
            ours = tower(pv, [grid])
            row = {"identity": identity, "media": label, "grid": list(grid), "patches": n,
                   "tokens": n // v.spatial_merge_size ** 2, "dtype": str(dtype).replace("torch.", ""),
                   "ninfer_ms": time_ms(lambda: tower(pv, [grid]), args.reps, device),
                   "ninfer_peak_mib": peak_mib(lambda: tower(pv, [grid]), device),
                   "activation_bound_mib": tower.activation_bytes([grid]) / MiB}
            for backends in args.sdpa_backends or ():
                alt = VisionTower(tower.view, dims, device, dtype, attention="sdpa", sdpa_backends=backends.split(","))
                row[f"ninfer_{backends}_ms"] = time_ms(lambda: alt(pv, [grid]), args.reps, device)
            if args.gelu_epilogue:
                alt = VisionTower(tower.view, dims, device, dtype, gelu_epilogue=not tower.gelu_epilogue)
                name = "ninfer_gelu_epilogue_ms" if alt.gelu_epilogue else "ninfer_no_gelu_epilogue_ms"
                row[name] = time_ms(lambda: alt(pv, [grid]), args.reps, device)
                row[name.replace("_ms", "_rel_rms")] = ((alt(pv, [grid]).double() - ours.double()).norm()
                                                        / ours.double().norm()).item()
            if hf is not None:
                theirs = hf(pv, grid_thw=grid_t).pooler_output
                row["rel_rms_vs_hf"] = ((ours.double() - theirs.double()).norm()
                                        / theirs.double().norm().clamp_min(1e-30)).item()
                row["hf_ms"] = time_ms(lambda: hf(pv, grid_thw=grid_t), args.reps, device)
                row["hf_peak_mib"] = peak_mib(lambda: hf(pv, grid_thw=grid_t).pooler_output, device)
                row["speedup"] = row["hf_ms"] / row["ninfer_ms"]
        row["gflop"] = tower_flops(v, grid) / 1e9
        row["floor_ms"] = tower_flops(v, grid) / peak_flops * 1e3 if peak_flops else None
        on_row(row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b", "qwen3_6-35b-a3b"])
    ap.add_argument("--device", default=default_device())
    ap.add_argument("--image", type=lambda s: parse_size(s, 2), default=(1024, 1024), help="HxW pixels")
    ap.add_argument("--video", type=lambda s: parse_size(s, 3), default=(30, 448, 448), help="FxHxW frames x pixels")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-hf", action="store_true", help="time NInfer's tower only")
    ap.add_argument("--gelu-epilogue", action="store_true",
                    help="also time the tower with the other setting of its fc1 GELU epilogue (CUDA)")
    ap.add_argument("--sdpa-backends", nargs="+", default=None, metavar="B[,B...]",
                    help="also time the tower with these torch SDPA kernel orders (e.g. cudnn_attention "
                         "flash_attention efficient_attention): one ninfer_<order>_ms column each")
    ap.add_argument("--no-ceilings", action="store_true", help="skip the matmul ceiling (no floor column)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--step-timeout", type=float, default=900.0, help="seconds per identity")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    env = env_record()
    print(f"env: {env}", flush=True)
    ceil = None if args.no_ceilings else measure_ceilings(str(device))
    if ceil:
        print_ceilings(ceil)
    tflops = (ceil or {}).get("matmul_sustained_TFLOPs") or (ceil or {}).get("matmul_8192_TFLOPs")
    rec = Recorder("vision_encode", args.out, {"env": env, "ceilings": ceil, "device": str(device),
                                               "image": args.image, "video": args.video, "reps": args.reps})

    def on_row(row: dict) -> None:
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
        rec.add(row)

    for identity in args.identity:
        run_step(rec, args.step_timeout, identity,
                 lambda: bench_identity(identity, [args.image, args.video], args, device,
                                        tflops * 1e12 if tflops else None, on_row))
        free_model(str(device))
    cols = ["identity", "media", "grid", "tokens", "ninfer_ms", "hf_ms", "speedup", "floor_ms", "ninfer_peak_mib",
            "activation_bound_mib", "hf_peak_mib", "rel_rms_vs_hf"]
    print_table(cols, [[str(r.get(c)) if c == "grid" else r.get(c) for c in cols] for r in rec.results])
    rec.finish()
    return 1 if rec.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
