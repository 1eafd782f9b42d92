"""Device memory of loading an identity's text weights (synthetic, bf16) through `load_model_view`.

Prints, after the load: allocated / reserved / peak reserved, what the driver reports free, and what the KV
pool sizing sees (the driver's free once the caching allocator has given its unused blocks back, as the
Program asks at start). `--compare MODULE` also loads through another module's `load_model_view` (e.g. an
older copy of model_view.py put on sys.path) in the same process, for an A/B of a loader change.
On the CPU (a smoke run with a tiny identity) it prints the load time and the view's bytes only.

    PYTHONPATH=$PWD python3 bench/load_peak.py --identity qwen3_6-27b qwen3_6-35b-a3b
    PYTHONPATH=$PWD python3 bench/load_peak.py --identity qwen3_6-tiny-dense --device cpu
"""
from __future__ import annotations

import argparse
import importlib
import json
import time

import torch

import ninfer.targets.qwen3_6.program.model_view as current
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.registry import lookup

G = 2 ** 30


def tensor_bytes(obj, seen: set[int] | None = None) -> int:
    """Bytes of the distinct tensor storages reachable from a model view (dataclasses, tuples, lists)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        names = list(getattr(obj, "__dict__", {})) + list(getattr(obj, "__slots__", ()))
        return sum(tensor_bytes(getattr(obj, n, None), seen) for n in names)
    return 0


def measure(ident: str, name: str, mod, dev: torch.device) -> dict:
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    w = DummyWeights(ident, device=dev, dtype=dtype)
    view = mod.load_model_view(lookup(ident).dims, w, dev, dtype)
    if cuda:
        torch.cuda.synchronize()
    row = {"identity": ident, "loader": name, "load_s": time.perf_counter() - t0, "view_gib": tensor_bytes(view) / G}
    if cuda:
        row.update(allocated_gib=torch.cuda.memory_allocated() / G, reserved_gib=torch.cuda.memory_reserved() / G,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / G,
                   driver_free_gib=torch.cuda.mem_get_info()[0] / G)
        torch.cuda.empty_cache()                       # what the KV pool sizing does before it asks
        row["pool_sizing_sees_gib"] = torch.cuda.mem_get_info()[0] / G
    print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    del view, w
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--identity", nargs="+", required=True)
    ap.add_argument("--compare", default="", help="module whose load_model_view to measure as well")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    loaders = [("current", current)] + ([(args.compare, importlib.import_module(args.compare))] if args.compare else [])
    dev = torch.device(args.device)
    rows = [measure(ident, name, mod, dev) for ident in args.identity for name, mod in loaders]
    print("JSON " + json.dumps({"bench": "load_peak", "device": torch.cuda.get_device_name() if dev.type == "cuda"
                                else "cpu", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
