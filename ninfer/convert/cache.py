"""A Hugging Face checkpoint directory where a model is taken: converted once into the user cache,
then loaded as the `.ninfer` file it became (the artifact stays the only thing the runtime loads).

Layout (under `ninfer.paths.user_cache_dir()`):

    converted/<dir name>-<hash of the directory's absolute path>/
        <source key>.ninfer      the conversion of the directory's current content
        .lock                    serialises processes that start on the same directory at once

The source key is a sha256 over what the converter reads, without reading the weights' bytes:
    config.json, model.safetensors.index.json, the tokenizer, chat template, generation and
    preprocessor files: full content
    each safetensors shard: name, size, mtime (ns) and its whole header (names, dtypes, shapes,
    offsets)
plus CACHE_VERSION, the artifact format version and the conversion options. An edited config or
tokenizer, a re-saved or replaced shard, or a newer converter gives a new key and one new
conversion; the conversion it replaces is then deleted, so a directory holds one converted file.
A copy of the checkpoint (new mtimes) converts again. The artifact itself records the sha256 of
every source file's full content (`ninfer inspect`).
"""
from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path
from typing import Callable

from ninfer.convert.converter import PREPROCESSOR_FILES, convert
from ninfer.convert.source import CheckpointSource, ConvertError
from ninfer.paths import file_lock, user_cache_dir

# NOTE: bump when the converter writes a different artifact for the same source and options.
CACHE_VERSION = 1
_CONTENT_FILES = ("config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                  "chat_template.jinja", "generation_config.json", *PREPROCESSOR_FILES)


def source_key(src: Path, *, dtype: str | None = None, target: str | None = None) -> str:
    """The cache key of checkpoint directory `src` (module docstring); ConvertError when `src` is not
    a readable checkpoint (no config.json, no shards, a malformed shard header)."""
    from ninfer.artifact.format import FORMAT_VERSION

    if not (src / "config.json").is_file():
        raise ConvertError("not a Hugging Face checkpoint directory (no config.json)")
    h = hashlib.sha256(f"ninfer-converted {CACHE_VERSION} format {FORMAT_VERSION} dtype {dtype} "
                       f"target {target}\n".encode())
    for name in _CONTENT_FILES:
        p = src / name
        if p.is_file():
            h.update(f"file {name} ".encode() + hashlib.sha256(p.read_bytes()).digest())
    source = CheckpointSource(src)          # NOTE: checks the shards' headers and the index
    try:
        shards = list(source.files)
    finally:
        source.close()
    for name in shards:
        p = src / name
        st = p.stat()
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = f.read(n)
        h.update(f"shard {name} {st.st_size} {st.st_mtime_ns} ".encode() + hashlib.sha256(header).digest())
    return h.hexdigest()


def cache_folder(src: Path) -> Path:
    """The cache folder of checkpoint directory `src` (one per absolute path)."""
    src = src.resolve()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", src.name)[:64] or "checkpoint"
    return user_cache_dir() / "converted" / f"{stem}-{hashlib.sha256(str(src).encode()).hexdigest()[:12]}"


def cached_path(src: Path, *, dtype: str | None = None, target: str | None = None) -> Path:
    """Where the conversion of `src`'s current content lives in the cache (whether or not it exists)."""
    return cache_folder(src) / f"{source_key(src, dtype=dtype, target=target)[:32]}.ninfer"


def _opens(path: Path) -> bool:
    from ninfer.artifact import open_artifact

    try:
        open_artifact(path).close()
    except Exception:           # noqa: BLE001 - any failure to open means "convert again"
        return False
    return True


def ensure_converted(src: str | Path, *, dtype: str | None = None, target: str | None = None,
                     progress: bool = True, on_convert: Callable[[Path], None] | None = None) -> Path:
    """The cached `.ninfer` conversion of checkpoint directory `src`, converting it first when the
    cache holds none for its current content (then `on_convert(path)` is called before the work,
    and a progress bar goes to stderr with `progress`). Raises ConvertError / ArtifactError."""
    src = Path(src)
    out = cached_path(src, dtype=dtype, target=target)
    folder = out.parent
    if out.is_file() and _opens(out):
        return out
    with file_lock(folder / ".lock"):
        if out.is_file() and _opens(out):            # another process converted it meanwhile
            return out
        if on_convert is not None:
            on_convert(out)
        convert(src, out, dtype=dtype, target=target, progress=progress)
        for stale in folder.glob("*.ninfer"):
            if stale != out:
                stale.unlink(missing_ok=True)
    return out
