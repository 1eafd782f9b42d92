"""A Hugging Face checkpoint directory as a read-only tensor source with bounded memory.

The safetensors header (8-byte little-endian length + JSON) is parsed here rather than through
`safetensors.safe_open` for two reasons: reads go through `pread` into small buffers, so the
process never maps a multi-GB shard (whose touched pages would count as resident memory), and a
single tensor larger than the memory budget (27B `embed_tokens` is 2.5 GB in bf16) can be read
in pieces. Truncated or malformed shards are reported with the shard name and byte counts.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
ST_SIZES = {"BF16": 2, "F16": 2, "F32": 4}
CHUNK_BYTES = 64 << 20


class ConvertError(Exception):
    """A checkpoint cannot be converted; the message names the problem."""


@dataclass(frozen=True, slots=True)
class SourceTensor:
    name: str
    file: str
    dtype: str            # safetensors dtype name (BF16, F16, F32)
    shape: tuple[int, ...]
    start: int            # absolute byte offset in the file
    nbytes: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return ST_DTYPES[self.dtype]


def read_header(path: Path) -> dict[str, SourceTensor]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ConvertError(f"shard {path.name} is truncated ({size} bytes, no safetensors header)")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8 or n > 100 << 20:
            raise ConvertError(f"shard {path.name} is truncated or not safetensors (header of {n} bytes, file {size})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ConvertError(f"shard {path.name}: invalid safetensors header: {e}") from None
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        if dt not in ST_DTYPES:
            raise ConvertError(f"shard {path.name}: tensor {name} has unsupported dtype {dt}")
        begin, end = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        numel = 1
        for s in shape:
            numel *= s
        if end - begin != numel * ST_SIZES[dt]:
            raise ConvertError(f"shard {path.name}: tensor {name} byte range does not match shape {list(shape)}")
        if base + end > size:
            raise ConvertError(f"shard {path.name} is truncated: tensor {name} needs bytes up to {base + end}, "
                               f"the file has {size}")
        out[name] = SourceTensor(name, path.name, dt, shape, base + begin, end - begin)
    return out


class CheckpointSource:
    """All safetensors shards of a directory (with or without `model.safetensors.index.json`)."""

    def __init__(self, src_dir: Path):
        self.dir = src_dir
        index = src_dir / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise ConvertError(f"{index.name} is invalid: {e}") from None
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (src_dir / f).is_file()]
            if missing:
                raise ConvertError(f"shard(s) named in {index.name} are missing: {', '.join(missing)}")
        else:
            weight_map = None
            files = sorted(p.name for p in src_dir.glob("*.safetensors"))
            if not files:
                raise ConvertError(f"no *.safetensors files in {src_dir}")
        self.files = files
        self.tensors: dict[str, SourceTensor] = {}
        for fname in files:
            for name, t in read_header(src_dir / fname).items():
                if name in self.tensors:
                    raise ConvertError(f"tensor {name} appears in both {self.tensors[name].file} and {fname}")
                self.tensors[name] = t
        if weight_map is not None:
            wrong = [k for k, f in weight_map.items() if self.tensors.get(k) is None or self.tensors[k].file != f]
            if wrong:
                raise ConvertError(f"{index.name} lists {len(wrong)} tensor(s) not found in the named shard: "
                                   f"{', '.join(sorted(wrong)[:8])}")
        self._fds: dict[str, int] = {}

    def _fd(self, fname: str) -> int:
        fd = self._fds.get(fname)
        if fd is None:
            fd = self._fds[fname] = os.open(self.dir / fname, os.O_RDONLY)
        return fd

    def read(self, t: SourceTensor, first: int = 0, count: int | None = None) -> torch.Tensor:
        """Elements [first, first+count) of `t` (flattened), as a new 1-D tensor of its dtype."""
        size = ST_SIZES[t.dtype]
        count = t.nbytes // size - first if count is None else count
        buf = bytearray(count * size)
        view = memoryview(buf)
        pos, off = 0, t.start + first * size
        while pos < len(buf):
            n = os.preadv(self._fd(t.file), [view[pos:]], off + pos)
            if n <= 0:
                raise ConvertError(f"shard {t.file} is truncated while reading {t.name}")
            pos += n
        return torch.frombuffer(buf, dtype=t.torch_dtype) if buf else torch.empty(0, dtype=t.torch_dtype)

    def chunks(self, t: SourceTensor, chunk_bytes: int = CHUNK_BYTES) -> Iterator[torch.Tensor]:
        numel = t.nbytes // ST_SIZES[t.dtype]
        step = max(1, chunk_bytes // ST_SIZES[t.dtype])
        for first in range(0, numel, step):
            yield self.read(t, first, min(step, numel - first))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
