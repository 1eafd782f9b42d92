"""Where NInfer keeps its per-user files (built demo model, built tokenizer files, models converted
from Hugging Face checkpoint directories), and the pieces of writing them atomically."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def user_cache_dir() -> Path:
    """$NINFER_CACHE_DIR, else $XDG_CACHE_HOME/ninfer, else ~/.cache/ninfer."""
    root = os.environ.get("NINFER_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "ninfer" if xdg else Path.home() / ".cache" / "ninfer"


def current_umask() -> int:
    """The process umask, read without changing it where the kernel reports it (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)          # NOTE: elsewhere the only way to read it is to set it and restore it
    os.umask(mask)
    return mask


def temp_file_beside(path: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """(fd, name) of a new temporary file in `path`'s directory, for a write that ends with
    `os.replace(name, path)`. Its mode is what `open(path, "w")` would give (0666 less the umask),
    not mkstemp's 0600, so that the renamed file is as readable as any other file the user writes."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    return fd, name


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if missing): serialises the first builds of a
    cached file by several processes starting at once. No-op where fcntl is missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:                         # pragma: no cover - not POSIX
        yield
        return
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
