"""Peak memory and time of `ninfer convert` on a multi-GB synthetic checkpoint.

The real checkpoints (52 GB / 72 GB, plus as much again for the output) do not fit this
machine's disk, so the benchmark builds a *bench-only* package with real Qwen3.6-27B widths
(hidden 5120, vocab 248320: `embed_tokens` and `lm_head` are 2.5 GB each in bf16, larger than
the 2 GB budget on their own) but only 4 decoder layers, with 35B-A3B-style MoE FFNs (64 experts,
stored per expert so the converter must fuse them) and an MTP layer; A_log / linear-attention
norm weights are F32 as in the 35B-A3B checkpoint. The identity is not registered: it is passed
to `convert(candidates=...)`, the documented benchmark hook; `open_artifact` would refuse it.

The checkpoint is written shard by shard (HF layout `model.language_model.*`, index file) from a
pool of random bytes, then converted in a child process whose peak RSS (ru_maxrss) is reported.

    python3 bench/convert_memory.py [--dir /work/tmp-bench] [--keep] [--tiny]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ninfer.targets.package import StorageProfile, TargetPackage
from ninfer.targets.qwen3_6.dims import Qwen36Dims, hybrid_layer_types
from ninfer.targets.qwen3_6.schema import tensor_specs
from ninfer.targets.registry import lookup

SHARD_BYTES = 4 << 30


def bench_package(tiny: bool = False) -> TargetPackage:
    """The bench-only package; tiny: the tiny MoE identity's widths (a smoke run of the same path)."""
    if tiny:
        base = lookup("qwen3_6-tiny-moe").dims
        dims = dataclasses.replace(base, num_hidden_layers=4, layer_types=hybrid_layer_types(4), vision=None)
        return TargetPackage("qwen3_6-bench-memory", "qwen3_6", dims, StorageProfile("bf16", "bench only"), __name__)
    base = lookup("qwen3_6-27b").dims
    dims = dataclasses.replace(
        base, num_hidden_layers=4, layer_types=hybrid_layer_types(4), intermediate_size=0, vision=None,
        num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512)
    return TargetPackage("qwen3_6-bench-memory", "qwen3_6", dims, StorageProfile("bf16", "bench only"), __name__)


def source_tensors(d: Qwen36Dims):
    """(HF name, shape, safetensors dtype) of a per-expert multimodal-layout checkpoint."""
    for s in tensor_specs(d):
        name = s.name if s.name.startswith(("mtp.", "lm_head")) else "model.language_model." + s.name
        dt = "F32" if s.name.endswith(("linear_attn.A_log", "linear_attn.norm.weight")) else "BF16"
        if ".mlp.experts." in s.name:
            prefix = name.rsplit(".", 1)[0]
            E, I, H = d.num_experts, d.moe_intermediate_size, d.hidden_size
            for e in range(E):
                if s.name.endswith("gate_up_proj"):
                    yield f"{prefix}.{e}.gate_proj.weight", (I, H), dt
                    yield f"{prefix}.{e}.up_proj.weight", (I, H), dt
                else:
                    yield f"{prefix}.{e}.down_proj.weight", (H, I), dt
        else:
            yield name, s.shape, dt


def write_checkpoint(out: Path, pkg: TargetPackage) -> int:
    from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files
    from ninfer.testing.tiny_hf import hf_text_config_kwargs

    out.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "qwen3_5_moe_text", **hf_text_config_kwargs(pkg.dims)}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    write_tokenizer_files(out)
    pool = np.random.default_rng(0).integers(0, 256, size=64 << 20, dtype=np.uint8)
    pool[1::2] &= 0x3F  # NOTE: small exponents, so the random bf16 (and F32) values are finite
    shards, cur, size = [], [], 0
    for name, shape, dt in source_tensors(pkg.dims):
        n = int(np.prod(shape)) * (4 if dt == "F32" else 2)
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape, dt, n))
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {}, 0
        for name, shape, dt, n in shard:
            header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        hb = json.dumps(header).encode()
        hb += b" " * (-len(hb) % 8)
        with open(out / fname, "wb") as f:
            f.write(len(hb).to_bytes(8, "little") + hb)
            for name, shape, dt, n in shard:
                left = n
                while left:
                    k = min(left, pool.nbytes)
                    f.write(pool[:k].data)
                    left -= k
        total += (out / fname).stat().st_size
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return total


def child(src: str, out: str, tiny: bool) -> None:
    from ninfer.convert import convert

    pkg = bench_package(tiny)
    t = time.perf_counter()
    convert(src, out, candidates={pkg.identity: pkg}, progress=True)
    print(json.dumps({"convert_s": time.perf_counter() - t}))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/work/tmp-bench-convert")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="the tiny MoE widths: a smoke run (seconds, a few MB)")
    ap.add_argument("--child", nargs=2)
    args = ap.parse_args(argv)
    if args.child:
        return child(*args.child, args.tiny)
    work = Path(args.dir)
    src, out = work / "src", work / "bench.ninfer"
    try:
        t = time.perf_counter()
        src_bytes = write_checkpoint(src, bench_package(args.tiny))
        t_write = time.perf_counter() - t
        r = subprocess.run([sys.executable, __file__, "--child", str(src), str(out)] + ["--tiny"] * args.tiny,
                           check=True, stdout=subprocess.PIPE, text=True)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        row = {"bench": "convert_memory", "identity": bench_package().identity, "source_bytes": src_bytes,
               "artifact_bytes": out.stat().st_size, "peak_rss_bytes": peak, "convert_s": round(res["convert_s"], 1),
               "checkpoint_write_s": round(t_write, 1), "cpus": os.cpu_count(),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()}
        print(f"source {src_bytes / 2**30:.2f} GiB -> artifact {row['artifact_bytes'] / 2**30:.2f} GiB in "
              f"{row['convert_s']} s; peak RSS {peak / 2**30:.2f} GiB")
        print(json.dumps(row))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
