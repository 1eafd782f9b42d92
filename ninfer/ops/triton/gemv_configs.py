"""Tiles of the decode GEMV (`ninfer.ops.triton.gemv`) and where it runs instead of cuBLAS.

The tuning table `ninfer/ops/configs/gemv.json` (written by `bench/gemv.py --write`) holds, per device
kind, keys "NxKxM" (M the row bucket `m_bucket`: 1, 2, 4 or 8):

    configs   the GemvConfig of each measured shape (others get `default_config`)
    triton    the shapes where the kernel beats cuBLAS, so `linear` runs it there (else F.linear)
    swiglu    the MLP down projections where `linear_swiglu` folds the SwiGLU into the kernel's x load

Some one-row entries (the mixers' in-projections split for the decode graph's side stream, the 35B-A3B
lm_head) were chosen in the whole decode step rather than per call (docs/performance.md, "Decision log").
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from ninfer.ops import tuning

__all__ = ["MAX_ROWS", "GemvConfig", "GemvTables", "parse_tables", "load_tables", "tables", "m_bucket",
           "use_triton", "use_swiglu", "concurrent_ok", "config_for", "default_config", "auto_split", "sweep_space",
           "shape_key"]

MAX_ROWS = 8


class GemvConfig(NamedTuple):
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    dot: bool = False
    prefetch: bool = False      # load the next weight block before this block's products (FMA path)



class GemvTables(NamedTuple):
    """One device kind's entry of the tuning table: keys (N, K, M bucket)."""
    configs: dict[tuple[int, int, int], GemvConfig]
    triton: frozenset[tuple[int, int, int]]
    swiglu: frozenset[tuple[int, int, int]]


def shape_key(n: int, k: int, m: int) -> str:
    return f"{n}x{k}x{m}"


def _parse_key(key: str) -> tuple[int, int, int]:
    n, k, m = (int(v) for v in key.split("x"))
    if m not in (1, 2, 4, 8):
        raise ValueError(f"row bucket {m} is not 1, 2, 4 or 8")
    return n, k, m


def parse_tables(entry: dict) -> GemvTables:
    """A `gemv.json` entry -> GemvTables (ValueError on a malformed one)."""
    try:
        configs = {_parse_key(key): GemvConfig(**cfg) for key, cfg in entry["configs"].items()}
        triton_ = frozenset(_parse_key(key) for key in entry["triton"])
        swiglu = frozenset(_parse_key(key) for key in entry.get("swiglu", ()))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"gemv tuning entry: expected configs {{NxKxM: GemvConfig fields}}, triton [NxKxM] and "
                         f"swiglu [NxKxM] ({type(e).__name__}: {e})") from e
    return GemvTables(configs, triton_, swiglu)


@functools.cache
def load_tables(kind: str | None = None) -> GemvTables:
    """The tables of device `kind` (None: this process's CUDA device) from `gemv.json`."""
    return parse_tables(tuning.load_entry("gemv", kind))


def tables() -> GemvTables:
    """This process's tables (loaded on first use)."""
    return load_tables()


def m_bucket(m: int) -> int:
    return 1 if m <= 1 else 2 if m == 2 else 4 if m <= 4 else 8


def use_triton(n: int, k: int, m: int) -> bool:
    """Whether `linear` of x [m, k] @ w[n, k].T runs the kernel (the table marks the shape)."""
    return (n, k, m_bucket(m)) in tables().triton


def use_swiglu(n: int, k: int, m: int) -> bool:
    """Whether `linear_swiglu` folds the SwiGLU into the kernel's x load for this down projection."""
    return (n, k, m_bucket(m)) in tables().swiglu


def concurrent_ok(n: int, k: int, m: int) -> bool:
    """Whether `linear` of x [m, k] @ w[n, k].T may run beside another GEMV on a second stream: not a
    split-K launch of the kernel (its arrival counters are one set per device, see `gemv`'s module NOTE)."""
    return not use_triton(n, k, m) or config_for(n, k, m).split_k == 1


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def default_config(n: int, k: int, m: int, num_sms: int = 132) -> GemvConfig:
    """Unmeasured fallback: FMA tiles for one row, tensor-core tiles for more; split K until about
    four programs per SM stream (each split keeps >= 4 K blocks)."""
    bk = min(512 if m <= 1 else 128, max(16, triton.next_power_of_2(k)))
    cfg = GemvConfig(16, bk, 1, 4, 1, False) if m <= 1 else GemvConfig(64, bk, 1, 4, 4, True)
    return cfg._replace(split_k=auto_split(n, k, cfg.block_n, cfg.block_k, num_sms))


def auto_split(n: int, k: int, block_n: int, block_k: int, num_sms: int = 132, per_sm: int = 4) -> int:
    tiles, kblocks, s = triton.cdiv(n, block_n), triton.cdiv(k, block_k), 1
    while tiles * s < per_sm * num_sms and kblocks >= 8 * s:
        s *= 2
    return s


def config_for(n: int, k: int, m: int, device: torch.device | None = None) -> GemvConfig:
    c = tables().configs.get((n, k, m_bucket(m)))
    if c is not None:
        return c
    return default_config(n, k, m, _num_sms(device) if device is not None else 132)


def sweep_space(n: int, k: int, m: int, num_sms: int = 132, full: bool = False) -> list[GemvConfig]:
    """The configs bench/gemv.py times for one (N, K, M) (and the tests run at small sizes). Tile
    shapes x {split 1, auto split (and half / double of it)} for shapes with few N tiles."""
    if m <= 1:
        tiles = [GemvConfig(8, 512, 1, 4, 1), GemvConfig(16, 512, 1, 4, 1), GemvConfig(16, 256, 1, 4, 1),
                 GemvConfig(32, 256, 1, 8, 1), GemvConfig(16, 512, 1, 4, 3), GemvConfig(32, 128, 1, 4, 1),
                 GemvConfig(32, 128, 1, 4, 4, True), GemvConfig(64, 128, 1, 4, 4, True),
                 GemvConfig(8, 512, 1, 4, 1, prefetch=True), GemvConfig(16, 512, 1, 4, 1, prefetch=True),
                 GemvConfig(8, 256, 1, 4, 1, prefetch=True), GemvConfig(16, 256, 1, 4, 1, prefetch=True),
                 GemvConfig(16, 512, 1, 8, 1, prefetch=True), GemvConfig(32, 256, 1, 8, 1, prefetch=True),
                 GemvConfig(8, 1024, 1, 4, 1, prefetch=True), GemvConfig(8, 1024, 1, 8, 1, prefetch=True)]
    else:
        tiles = [GemvConfig(32, 128, 1, 4, 4, True), GemvConfig(64, 128, 1, 4, 4, True),
                 GemvConfig(64, 256, 1, 4, 3, True), GemvConfig(128, 128, 1, 4, 4, True),
                 GemvConfig(32, 256, 1, 4, 3, True), GemvConfig(128, 64, 1, 8, 6, True)]
        if m <= 2:
            tiles += [GemvConfig(16, 256, 1, 4, 1), GemvConfig(8, 512, 1, 4, 1)]
        elif m <= 4 or full:
            tiles += [GemvConfig(16, 128, 1, 4, 1)]
    if full:
        tiles += [GemvConfig(16, 64, 1, 2, 1), GemvConfig(16, 64, 1, 4, 2, True)]
    out: list[GemvConfig] = []
    for t in tiles:
        bk = min(t.block_k, max(16, triton.next_power_of_2(k)))
        t = t._replace(block_k=bk)
        s = auto_split(n, k, t.block_n, bk, num_sms)
        splits = {1, s} | ({max(1, s // 2), s * 2} if s > 1 and triton.cdiv(k, bk) >= 16 * s else set())
        if full:
            splits |= {2, 3}
        out += [t._replace(split_k=sp) for sp in sorted(splits)]
    return list(dict.fromkeys(out))

