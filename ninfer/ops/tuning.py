"""Tuning tables of the fast kernels: `ninfer/ops/configs/<table>.json`, written by the tuning scripts
(bench/gemv.py, bench/moe_decode.py with `--write`), read here.

A table file maps a device kind to its entry, with a "default" entry for every other device:

    {"default": {...}, "<device kind>": {...}}

The device kind is `torch.cuda.get_device_name` normalised (`device_kind`); without CUDA it is
"default". What an entry holds is up to the table's reader (`gemv`, `moe_decode`); a file that is not
such a mapping raises a ValueError that names it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

__all__ = ["CONFIG_DIR", "device_kind", "table_path", "read_table_file", "load_entry", "write_entry"]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def device_kind(device: torch.device | str | None = None) -> str:
    """The CUDA device's name (`torch.cuda.get_device_name`) lower case, each run of other characters than
    a-z and 0-9 as one "-" ("Vendor Model 80GB" -> "vendor-model-80gb"). "default" for a CPU device, or
    without CUDA."""
    if device is not None and torch.device(device).type != "cuda":
        return "default"
    if not torch.cuda.is_available():
        return "default"
    name = torch.cuda.get_device_name(device)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "default"


def table_path(name: str) -> Path:
    return CONFIG_DIR / f"{name}.json"


def read_table_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The {device kind: entry} mapping of a table file (entries are JSON objects; "default" required)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON tuning table ({e})") from e
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in data.items()):
        raise ValueError(f"{path}: a tuning table maps device kinds to JSON objects")
    if "default" not in data:
        raise ValueError(f"{path}: no \"default\" entry")
    return data


def load_entry(name: str, kind: str | None = None, *, path: str | Path | None = None) -> dict[str, Any]:
    """The entry of device `kind` (None: this process's CUDA device) in table `name`, else its "default"."""
    data = read_table_file(path if path is not None else table_path(name))
    kind = device_kind() if kind is None else kind
    return data.get(kind, data["default"])


def write_entry(path: str | Path, kind: str, entry: dict[str, Any]) -> None:
    """Set the entry of `kind` in the table file at `path` (created with entry as its "default" when
    missing), keeping every other entry."""
    path = Path(path)
    data = read_table_file(path) if path.exists() else {"default": entry}
    data[kind] = entry
    path.write_text(_dumps(data), encoding="utf-8")


def _dumps(data: dict[str, dict[str, Any]]) -> str:
    """JSON with one line per leaf of an entry (a table of shapes reads one shape a line)."""
    def block(d: dict, indent: int, leaf_depth: int) -> str:
        pad = " " * indent
        if not d:
            return "{}"
        items = []
        for k, v in d.items():
            val = block(v, indent + 1, leaf_depth - 1) if isinstance(v, dict) and leaf_depth > 0 else json.dumps(v)
            items.append(f"{pad} {json.dumps(k)}: {val}")
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return block(dict(sorted(data.items())), 0, 2) + "\n"
