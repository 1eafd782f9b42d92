"""Open a `.ninfer` file: validate the framing and the descriptor, map the payloads zero-copy.

Every check runs before anything is handed out; a failure raises one ArtifactError and releases
the file handle and the mapping. Tensors are views of one private (copy-on-write) file mapping,
so they page in lazily, and a tensor handed out stays valid after `close()`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch

from ninfer.artifact.format import (CHECKSUM, DATA_START, DTYPES, FORMAT_VERSION, HEADER_STRUCT, MAGIC,
                                    RESOURCE_NAMES, REQUIRED_RESOURCES, STORAGE_DTYPES, ArtifactError, element_size)
from ninfer.artifact.schema_check import table_problems
from ninfer.targets.package import TargetPackage
from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.registry import UnknownIdentityError, lookup


class Artifact:
    """A validated, open `.ninfer` file. Use `open_artifact`; close with `.close()` or `with`."""

    def __init__(self, path: Path, fd: int, descriptor: dict, package: TargetPackage, storage: torch.UntypedStorage):
        self.path = path
        self._fd = fd
        self._storage: torch.UntypedStorage | None = storage
        self.descriptor = descriptor
        self.package = package
        self.identity: str = package.identity
        self.dims: Qwen36Dims = package.dims
        self.dtype: str = descriptor["storage"]["dtype"]
        self.groups: tuple[str, ...] = tuple(descriptor["groups"])
        self._tensors = {e["name"]: e for e in descriptor["tensors"]}
        self._resources = {e["name"]: e for e in descriptor["resources"]}
        gen = descriptor["generation"]
        self.eos_token_ids: tuple[int, ...] = tuple(gen["eos_token_ids"])
        self.generation_config: dict = dict(gen.get("config") or {})

    # ---- tensors ----
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_group(self, group: str) -> bool:
        return group in self.groups

    def tensor_info(self, name: str) -> dict:
        return self._tensors[name]

    def tensor(self, name: str) -> torch.Tensor:
        """A read-only-by-convention view of the mapped payload (writes stay private to this process)."""
        if self._storage is None:
            raise ArtifactError(f"{self.path} is closed")
        try:
            e = self._tensors[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self.path}") from None
        dt = DTYPES[e["dtype"]]
        size = element_size(e["dtype"])
        shape = tuple(e["shape"])
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return torch.empty(0, dtype=dt).set_(self._storage, e["offset"] // size, shape, stride)

    # ---- frontend resources ----
    def frontend_resources(self) -> dict[str, bytes]:
        """Raw bytes of the stored frontend files (checksums always verified; they are small)."""
        out = {}
        for name, e in self._resources.items():
            data = os.pread(self._require_fd(), e["nbytes"], e["offset"])
            if len(data) != e["nbytes"] or hashlib.sha256(data).hexdigest() != e[CHECKSUM]:
                raise ArtifactError(f"{self.path}: resource {name} is corrupted (checksum mismatch)")
            out[name] = data
        return out

    def verify(self) -> None:
        """Check every tensor payload checksum; raise ArtifactError naming the first bad tensor."""
        for name, e in self._tensors.items():
            data = self.tensor(name).reshape(-1).view(torch.uint8).numpy()
            if hashlib.sha256(data).hexdigest() != e[CHECKSUM]:
                raise ArtifactError(f"{self.path}: checksum mismatch in tensor {name} (the file is corrupted)")
        self.frontend_resources()

    def _require_fd(self) -> int:
        if self._fd < 0:
            raise ArtifactError(f"{self.path} is closed")
        return self._fd

    # ---- lifetime ----
    def close(self) -> None:
        self._storage = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "Artifact":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_fd", -1) >= 0:
            self.close()

    def __repr__(self) -> str:
        return f"Artifact({str(self.path)!r}, identity={self.identity!r}, dtype={self.dtype}, groups={self.groups})"


def open_artifact(path: str | os.PathLike, verify: bool = False) -> Artifact:
    """Open and validate a `.ninfer` file; with `verify`, also check every payload checksum."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise ArtifactError(f"cannot open {path}: {e.strerror or e}") from None
    art = None
    try:
        descriptor, package, size = _read_descriptor(path, fd)
        storage = torch.UntypedStorage.from_file(str(path), False, size)
        art = Artifact(path, fd, descriptor, package, storage)
        if verify:
            art.verify()
        return art
    except BaseException as e:
        if art is not None:
            art.close()
        else:
            os.close(fd)
        if isinstance(e, ArtifactError) or not isinstance(e, Exception):
            raise
        raise ArtifactError(f"{path}: cannot be loaded: {e}") from None


def _read_descriptor(path: Path, fd: int) -> tuple[dict, TargetPackage, int]:
    size = os.fstat(fd).st_size
    head = os.pread(fd, HEADER_STRUCT.size, 0)
    if len(head) < HEADER_STRUCT.size or head[:len(MAGIC)] != MAGIC:
        raise ArtifactError(f"{path} is not a .ninfer file (wrong magic)")
    _, version, _flags, d_off, d_len, f_size, digest = HEADER_STRUCT.unpack(head)
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: unsupported .ninfer format version {version} (this NInfer reads {FORMAT_VERSION})")
    if size < f_size:
        raise ArtifactError(f"{path} is truncated: {size} bytes, the header says {f_size}")
    if size > f_size:
        raise ArtifactError(f"{path} has {size - f_size} unexpected trailing bytes (header says {f_size})")
    if d_off < DATA_START or d_off + d_len != f_size:
        raise ArtifactError(f"{path}: inconsistent header (descriptor at {d_off}+{d_len}, file size {f_size})")
    blob = os.pread(fd, d_len, d_off)
    if hashlib.sha256(blob).digest() != digest:
        raise ArtifactError(f"{path}: descriptor checksum mismatch (the file is corrupted)")
    try:
        desc = json.loads(blob)
    except ValueError as e:
        raise ArtifactError(f"{path}: descriptor is not valid JSON: {e}") from None
    try:
        package = _check_descriptor(desc, d_off)
    except ArtifactError as e:
        raise ArtifactError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: malformed descriptor ({type(e).__name__}: {e})") from None
    return desc, package, size


def _check_descriptor(desc: dict, payload_end: int) -> TargetPackage:
    if desc.get("format") != "ninfer" or desc.get("format_version") != FORMAT_VERSION:
        raise ArtifactError("descriptor format/version disagrees with the header")
    try:
        package = lookup(desc["identity"])
    except UnknownIdentityError as e:
        raise ArtifactError(str(e)) from None
    stored_dims = Qwen36Dims.from_dict(desc["dims"])
    if stored_dims != package.dims:
        diff = [k for k, v in stored_dims.as_dict().items() if package.dims.as_dict()[k] != v]
        raise ArtifactError(f"dimension facts disagree with the registered {package.identity}: {', '.join(diff)}")
    dtype = desc["storage"]["dtype"]
    if dtype not in STORAGE_DTYPES:
        raise ArtifactError(f"unknown storage dtype {dtype!r}")
    if desc["storage"].get("checksum") != CHECKSUM:
        raise ArtifactError(f"unknown checksum kind {desc['storage'].get('checksum')!r}")
    align = int(desc["storage"]["alignment"])
    spans = []
    present = {}
    for e in desc["tensors"]:
        name = e["name"]
        if name in present:
            raise ArtifactError(f"tensor table lists {name} twice")
        if e["dtype"] not in DTYPES:
            raise ArtifactError(f"tensor {name}: unknown dtype {e['dtype']!r}")
        shape = tuple(int(s) for s in e["shape"])
        if any(s < 0 for s in shape) or math.prod(shape) * element_size(e["dtype"]) != e["nbytes"]:
            raise ArtifactError(f"tensor {name}: shape {list(shape)} x {e['dtype']} != nbytes {e['nbytes']}")
        if e["offset"] % align or e["offset"] % element_size(e["dtype"]):
            raise ArtifactError(f"tensor {name}: offset {e['offset']} is not aligned to {align}")
        present[name] = (shape, e["dtype"])
        spans.append((e["offset"], e["nbytes"], f"tensor {name}"))
    problems = table_problems(lookup(desc["identity"]), present, dtype, tuple(desc["groups"]))
    if problems:
        raise ArtifactError("tensor table inconsistent with the schema: " + "; ".join(problems))
    res_names = [e["name"] for e in desc["resources"]]
    bad = sorted(set(res_names) - set(RESOURCE_NAMES)) + [r for r in REQUIRED_RESOURCES if r not in res_names]
    if bad or len(set(res_names)) != len(res_names):
        raise ArtifactError(f"resource table is inconsistent (unknown, missing or repeated: {', '.join(bad) or 'repeated'})")
    spans += [(e["offset"], e["nbytes"], f"resource {e['name']}") for e in desc["resources"]]
    spans.sort()
    prev_end, prev_what = DATA_START, "header"
    for off, n, what in spans:
        if off < prev_end:
            raise ArtifactError(f"{what} at offset {off} overlaps {prev_what}")
        if off + n > payload_end:
            raise ArtifactError(f"{what} at offset {off}+{n} runs past the payload region (ends at {payload_end})")
        prev_end, prev_what = off + n, what
    eos = desc["generation"]["eos_token_ids"]
    if not eos or not all(isinstance(i, int) for i in eos):
        raise ArtifactError(f"invalid eos token ids {eos!r}")
    return package
