"""Device memory of loading a real-size identity's text weights (synthetic, bf16) through load_model_view.

Prints allocated / reserved / peak reserved after the load, what the driver reports free, and what the
KV pool sizing sees (program._free_device_bytes: the driver's free once the allocator returns its cache).
`--compare MODULE` also loads through another module's load_model_view (e.g. an older copy put on
sys.path) in the same process, for an A/B.

    python3 bench/load_peak.py --identity qwen3_6-27b qwen3_6-35b-a3b
"""
from __future__ import annotations

import argparse
import importlib
import time

import torch

import ninfer.targets.qwen3_6.program.model_view as current
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.program import _free_device_bytes
from ninfer.targets.registry import lookup

G = 2 ** 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--identity", nargs="+", required=True)
    ap.add_argument("--compare", default="", help="module whose load_model_view to measure as well")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("load_peak: needs CUDA")
    loaders = [("current", current)] + ([(args.compare, importlib.import_module(args.compare))] if args.compare else [])
    dev = torch.device("cuda")
    for ident in args.identity:
        for name, mod in loaders:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            w = DummyWeights(ident, device=dev, dtype=torch.bfloat16)
            view = mod.load_model_view(lookup(ident).dims, w, dev, torch.bfloat16)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            alloc, res, peak = torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()
            drv = torch.cuda.mem_get_info()[0]
            print(f"{ident:16s} {name:20s} load {dt:5.1f} s  allocated {alloc / G:6.2f}  reserved {res / G:6.2f}  "
                  f"peak reserved {peak / G:6.2f}  driver free {drv / G:6.2f}  "
                  f"pool sizing sees {_free_device_bytes(dev)[0] / G:6.2f} GiB", flush=True)
            del view, w


if __name__ == "__main__":
    main()
