"""Peak memory of CausalScoring long texts with a tiny model: bounded by the window, not the text.

    python3 bench/score_memory.py                          # 10k, 30k, 100k tokens, window 8192
    python3 bench/score_memory.py --tokens 100000 --window 4096 --stride 2048

Builds the tiny dense test model (random weights, the real 248,320-entry vocabulary), starts an
Engine with purpose causal_scoring and scores one random-token text per length. For each length it
resets the process's peak RSS (`/proc/self/clear_refs` 5) after the previous run and reads VmHWM
after scoring, so each figure is the peak while scoring that text (the loaded model included).
Prints a table and one JSON line (machine, dtype, identity, commit).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--stride", type=int, default=None)
    ap.add_argument("--kind", default="dense", choices=("dense", "moe"))
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    import torch

    from ninfer import Engine, EngineConfig
    from ninfer.convert import convert
    from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files
    from ninfer.testing.tiny_hf import KINDS, write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        write_tiny_checkpoint(src, args.kind, "text")
        write_tokenizer_files(src)
        artifact = convert(src, Path(tmp) / "tiny.ninfer", dtype="fp32")
        shutil.rmtree(src)                      # disk: only the artifact is used
        engine = Engine(artifact, EngineConfig(purpose="causal_scoring", device=args.device, dtype="fp32",
                                               max_model_len=args.window))
        assert engine.wait_ready().ready, engine.availability
        loaded_kib = _status_kib("VmRSS")
        rows = []
        for n in args.tokens:
            ids = torch.randint(0, 248_000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            _reset_peak()
            base_kib = _status_kib("VmRSS")
            t0 = time.monotonic()
            [res] = engine.score([ids], window=args.window, stride=args.stride)
            elapsed = time.monotonic() - t0
            peak_kib = _status_kib("VmHWM")
            rows.append({"tokens": n, "scored_tokens": res.num_scored_tokens, "perplexity": res.perplexity,
                         "rss_before_mib": base_kib / 1024, "peak_rss_mib": peak_kib / 1024,
                         "peak_minus_before_mib": (peak_kib - base_kib) / 1024, "seconds": elapsed,
                         "tokens_per_s": n / elapsed})
            print(f"scored {n} tokens in {elapsed:.1f}s", file=sys.stderr, flush=True)
        engine.close()

    print(f"{'tokens':>8} {'scored':>8} {'RSS before MiB':>15} {'peak RSS MiB':>13} {'growth MiB':>11} "
          f"{'seconds':>8} {'tok/s':>7}")
    for r in rows:
        print(f"{r['tokens']:>8} {r['scored_tokens']:>8} {r['rss_before_mib']:>15.0f} {r['peak_rss_mib']:>13.0f} "
              f"{r['peak_minus_before_mib']:>11.0f} {r['seconds']:>8.1f} {r['tokens_per_s']:>7.0f}")
    print(json.dumps({"bench": "score_memory", "identity": KINDS[args.kind], "dtype": "fp32",
                      "device": args.device, "window": args.window, "stride": args.stride or args.window,
                      "rss_after_load_mib": loaded_kib / 1024,
                      "machine": f"{platform.machine()} {os.cpu_count()} cpus", "commit": _commit(),
                      "torch_threads": torch.get_num_threads(), "runs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
