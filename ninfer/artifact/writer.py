"""Streaming, atomic `.ninfer` writer.

Tensors are consumed one at a time (and a `ChunkedTensor` piece by piece), cast to the storage
dtype, checksummed and written at aligned offsets; the descriptor goes last and the header is
patched at the end. Everything is written to a temporary file in the destination directory,
fsynced and renamed into place (with the mode the umask gives a new file); on any failure (a schema error, ENOSPC, an interrupt) the
temporary file is removed and the destination is left as it was.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import torch

from ninfer.artifact.format import (ALIGNMENT, CHECKSUM, DATA_START, DTYPE_NAMES, FORMAT_VERSION, RESOURCE_NAMES,
                                    REQUIRED_RESOURCES, STORAGE_DTYPES, ArtifactError, align_up, pack_header)
from ninfer.artifact.schema_check import all_specs, storage_dtype, table_problems
from ninfer.paths import temp_file_beside
from ninfer.targets.package import TargetPackage
from ninfer.targets.qwen3_6.schema import OPTIONAL_GROUPS, REQUIRED_GROUPS
from ninfer.targets.registry import UnknownIdentityError, lookup

_ZEROS = bytes(ALIGNMENT)


@dataclass(frozen=True)
class ChunkedTensor:
    """A tensor produced piecewise, for tensors too large to hold at once.

    `chunks()` yields tensors of dtype `dtype` whose flattened concatenation, in order, is the
    row-major content of a tensor of shape `shape`.
    """
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: Callable[[], Iterator[torch.Tensor]]


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _tensor_bytes(t: torch.Tensor):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


class _Writer:
    def __init__(self, fd: int):
        self.fd = fd
        self.pos = DATA_START
        os.lseek(fd, 0, os.SEEK_SET)
        _write_all(fd, bytes(DATA_START))  # header placeholder, patched last

    def pad(self) -> int:
        target = align_up(self.pos)
        if target > self.pos:
            _write_all(self.fd, _ZEROS[: target - self.pos])
            self.pos = target
        return self.pos

    def write(self, data, h) -> int:
        mv = memoryview(data).cast("B")
        h.update(mv)
        _write_all(self.fd, mv)
        self.pos += mv.nbytes
        return mv.nbytes


def _chunks_of(t: torch.Tensor | ChunkedTensor) -> Iterator[torch.Tensor]:
    if isinstance(t, ChunkedTensor):
        yield from t.chunks()
    else:
        yield t


def _eos_from_generation(resources: Mapping[str, bytes]) -> tuple[dict, list[int]]:
    raw = resources.get("generation_config.json")
    if raw is None:
        return {}, []
    try:
        cfg = json.loads(raw)
    except ValueError as e:
        raise ArtifactError(f"generation_config.json is not valid JSON: {e}") from None
    eos = cfg.get("eos_token_id")
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    return cfg, ids


def _resolve_package(identity: str | TargetPackage) -> TargetPackage:
    if isinstance(identity, TargetPackage):
        return identity  # NOTE: benchmarks only; open_artifact accepts registered identities only
    try:
        return lookup(identity)
    except UnknownIdentityError as e:
        raise ArtifactError(str(e)) from None


def write_artifact(path: str | os.PathLike, identity: str | TargetPackage,
                   tensors: Iterable[tuple[str, torch.Tensor | ChunkedTensor]],
                   resources: Mapping[str, bytes], *, dtype: str | None = None,
                   groups: tuple[str, ...] | None = None, eos_token_ids: tuple[int, ...] | None = None,
                   source: dict | Callable[[], dict] | None = None,
                   on_tensor: Callable[[str, int], None] | None = None) -> Path:
    """Write a `.ninfer` file atomically and return its path.

    identity   a registered identity (or, for benchmarks, a TargetPackage that open_artifact
               will refuse unless it is registered).
    tensors    (canonical name, tensor | ChunkedTensor) pairs, consumed one at a time, any order.
               Each is cast to `dtype` (default: the package's storage dtype), except fp32
               `linear_attn.A_log` / `linear_attn.norm.weight`, which stay fp32.
    resources  {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} required,
               "generation_config.json", "preprocessor_config.json" and
               "video_preprocessor_config.json" optional; raw bytes.
    groups     tensor groups stored; default: required groups plus every optional group (mtp,
               vision) of which a tensor was given. Every tensor of a stored group is required.
    eos_token_ids  default: `eos_token_id` of generation_config.json.
    source     provenance dict stored verbatim under descriptor["source"], or a callable
               returning it (called after the payloads are written).
    on_tensor  called with (name, stored nbytes) after each tensor (progress display).
    Raises ArtifactError naming the problem; the destination is then untouched.
    """
    package = _resolve_package(identity)
    dtype = dtype or package.storage.default_dtype
    if dtype not in STORAGE_DTYPES:
        raise ArtifactError(f"unsupported storage dtype {dtype!r}; choose one of {', '.join(STORAGE_DTYPES)}")
    unknown_res = sorted(set(resources) - set(RESOURCE_NAMES))
    if unknown_res:
        raise ArtifactError(f"unknown frontend resource(s): {', '.join(unknown_res)}")
    missing_res = [r for r in REQUIRED_RESOURCES if r not in resources]
    if missing_res:
        raise ArtifactError(f"missing frontend resource(s): {', '.join(missing_res)}")
    gen_cfg, gen_eos = _eos_from_generation(resources)
    eos = list(eos_token_ids) if eos_token_ids is not None else gen_eos
    if not eos or not all(isinstance(i, int) and 0 <= i < package.dims.vocab_size for i in eos):
        raise ArtifactError(f"invalid or missing eos token ids {eos!r}")
    if groups is not None:
        bad = [g for g in groups if g not in REQUIRED_GROUPS + OPTIONAL_GROUPS]
        if bad:
            raise ArtifactError(f"unknown tensor group(s): {', '.join(bad)}")

    path = Path(path)
    out_dir = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ArtifactError(f"{path} is a directory")
    try:
        fd, tmp = temp_file_beside(out_dir / path.name, suffix=".partial")
    except OSError as e:
        raise ArtifactError(f"cannot create a file in {out_dir}: {e.strerror or e}") from None
    try:
        desc = _stream(fd, package, dtype, groups, tensors, resources, on_tensor)
        desc["generation"] = {"eos_token_ids": eos, "config": gen_cfg}
        desc["source"] = (source() if callable(source) else source) or {}
        w_pos = os.lseek(fd, 0, os.SEEK_END)
        blob = json.dumps(desc, indent=None, separators=(",", ":"), sort_keys=False).encode()
        _write_all(fd, blob)
        digest = hashlib.sha256(blob).digest()
        os.lseek(fd, 0, os.SEEK_SET)
        _write_all(fd, pack_header(w_pos, len(blob), w_pos + len(blob), digest))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        tmp = None
        dfd = os.open(out_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        what = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise ArtifactError(f"writing {path} failed: {what}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    return path


def _stream(fd: int, package: TargetPackage, dtype: str, groups, tensors, resources, on_tensor) -> dict:
    known = all_specs(package)
    w = _Writer(fd)
    table: list[dict] = []
    seen: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, t in tensors:
        if name in seen:
            raise ArtifactError(f"tensor {name} given twice")
        if name not in known:
            raise ArtifactError(f"unexpected tensor {name} (not in the {package.identity} schema)")
        shape = tuple(int(s) for s in t.shape)
        if shape != known[name].shape:
            raise ArtifactError(f"tensor {name} has shape {list(shape)}, expected {list(known[name].shape)}")
        if t.dtype not in DTYPE_NAMES:
            raise ArtifactError(f"tensor {name} has unsupported dtype {t.dtype}")
        stored = storage_dtype(name, DTYPE_NAMES[t.dtype], dtype)
        target = {"bf16": torch.bfloat16, "fp32": torch.float32}[stored]
        offset = w.pad()
        h = hashlib.sha256()
        numel = 0
        for chunk in _chunks_of(t):
            if chunk.dtype != t.dtype:
                raise ArtifactError(f"tensor {name}: chunk dtype {chunk.dtype} differs from {t.dtype}")
            numel += chunk.numel()
            w.write(_tensor_bytes(chunk.to(target)), h)
        expect = 1
        for s in shape:
            expect *= s
        if numel != expect:
            raise ArtifactError(f"tensor {name}: produced {numel} elements, shape {list(shape)} needs {expect}")
        nbytes = w.pos - offset
        seen[name] = (shape, stored)
        table.append({"name": name, "group": known[name].group, "dtype": stored, "shape": list(shape),
                      "offset": offset, "nbytes": nbytes, CHECKSUM: h.hexdigest()})
        if on_tensor is not None:
            on_tensor(name, nbytes)
    if groups is None:
        present = {known[n].group for n in seen}
        groups = REQUIRED_GROUPS + tuple(g for g in OPTIONAL_GROUPS if g in present)
    problems = table_problems(package, seen, dtype, tuple(groups))
    if problems:
        raise ArtifactError("tensor set does not match the " + package.identity + " schema: " + "; ".join(problems))
    res_table = []
    for rname in RESOURCE_NAMES:
        if rname not in resources:
            continue
        offset = w.pad()
        h = hashlib.sha256()
        n = w.write(bytes(resources[rname]), h)
        res_table.append({"name": rname, "offset": offset, "nbytes": n, CHECKSUM: h.hexdigest()})
    w.pad()
    return {
        "format": "ninfer", "format_version": FORMAT_VERSION,
        "identity": package.identity, "family": package.family,
        "dims": package.dims.as_dict(),
        "storage": {"dtype": dtype, "alignment": ALIGNMENT, "checksum": CHECKSUM,
                    "profile": package.storage.description},
        "groups": list(groups),
        "tensors": table,
        "resources": res_table,
    }
