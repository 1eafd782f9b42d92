"""What the Engine reports and checks while it starts: the memory a device offers, the progress of the
load and of the serve warmup.

    memory budget   NINFER_MEMORY_BUDGET (bytes, or with a K/M/G/T suffix, powers of 1024) when set: a
                    stand-in for the device's memory (tests, or to keep a process within a share of the host);
                    else on the CPU the host's MemAvailable (/proc/meminfo); the facade asks CUDA itself
    StartProgress   phase "loading" (weight bytes read of the total, ETA from the rate so far), then
                    "initializing" (pools, CUDA graphs), then, for `Engine.warm_up`, "warming_up" (prompts
                    run of the total); `snapshot()` is the dict `/health` shows and the CLI prints
"""
from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

BUDGET_ENV = "NINFER_MEMORY_BUDGET"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """'123', '512M', '24G', '1.5GiB' -> bytes (suffixes are powers of 1024); ValueError names the form."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"{BUDGET_ENV} must be a byte count such as 24000000000, 512M or 24G, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def budget_override() -> int | None:
    """NINFER_MEMORY_BUDGET in bytes, or None when unset."""
    text = os.environ.get(BUDGET_ENV, "")
    return parse_bytes(text) if text.strip() else None


def host_available_bytes() -> int:
    """Memory the host can give a new allocation without swapping: MemAvailable, else free physical pages."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(n: int | float) -> str:
    """Bytes for a message: GiB with one decimal from 1 GiB, else whole MiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class StartProgress:
    """How far the start is (module docstring). Written by the loading thread, read by any other."""

    def __init__(self, total_bytes: int, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._phase, self._done, self._total, self._unit = "loading", 0, max(0, int(total_bytes)), "bytes"
        self._t0 = clock()

    def add(self, n: int) -> None:
        """n more bytes (prompts) done; the last byte of the weights starts phase "initializing"."""
        with self._lock:
            self._done = min(self._total, self._done + int(n))
            if self._phase == "loading" and self._done >= self._total:
                self._phase, self._t0 = "initializing", self._clock()

    def remaining(self) -> int:
        return self._total - self._done

    def warming(self, total: int) -> None:
        with self._lock:
            self._phase, self._done, self._total, self._unit = "warming_up", 0, total, "prompts"
            self._t0 = self._clock()

    def finished(self) -> None:
        with self._lock:
            self._phase = "ready"

    @property
    def phase(self) -> str:
        return self._phase

    def snapshot(self) -> dict[str, Any]:
        """{"phase", "done", "total", "unit", "fraction", "elapsed_s", "eta_s"} (eta_s None until a rate is known)."""
        with self._lock:
            phase, done, total, unit = self._phase, self._done, self._total, self._unit
            elapsed = self._clock() - self._t0
        eta = None
        if phase in ("loading", "warming_up") and 0 < done:
            eta = round(elapsed * (total - done) / done, 1)
        return {"phase": phase, "done": done, "total": total, "unit": unit,
                "fraction": round(done / total, 4) if total else 1.0, "elapsed_s": round(elapsed, 1), "eta_s": eta}


def progress_line(p: dict[str, Any]) -> str:
    """One line for a terminal or a log: 'loading the weights: 3.2 GiB of 54.1 GiB (6%), 41 s, about 10 min left'."""
    if p["phase"] == "initializing":
        return f"initializing (KV pool, state, graphs): {p['elapsed_s']:.0f} s"
    if p["unit"] == "bytes":
        amount = f"{gib(p['done'])} of {gib(p['total'])}"
    else:
        amount = f"{p['done']} of {p['total']} {p['unit']}"
    what = "loading the weights" if p["phase"] == "loading" else p["phase"].replace("_", " ")
    left = "" if p["eta_s"] is None else f", about {_duration(p['eta_s'])} left"
    return f"{what}: {amount} ({100 * p['fraction']:.0f}%), {p['elapsed_s']:.0f} s{left}"


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


class CountingWeights:
    """A Program's weights (an Artifact, DummyWeights or a mapping) that count each tensor handed out into
    a StartProgress, as `size_of(name, numel)` bytes (its size on the device), once the next is asked for
    (the copy to the device runs in between)."""

    def __init__(self, weights: Any, progress: StartProgress, size_of) -> None:
        self._weights, self._progress, self._size_of, self._last = weights, progress, size_of, 0

    def tensor(self, name: str):
        self._progress.add(self._last)
        t = self._weights.tensor(name) if hasattr(self._weights, "tensor") else self._weights[name]
        self._last = self._size_of(name, int(t.numel()))
        if self._last >= self._progress.remaining():      # the last tensor: the weights are read
            self._progress.add(self._last)
            self._last = 0
        return t

    def __getattr__(self, name: str) -> Any:
        return getattr(self._weights, name)
