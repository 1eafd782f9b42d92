"""Where NInfer keeps its per-user files (built demo model, built tokenizer files)."""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """$NINFER_CACHE_DIR, else $XDG_CACHE_HOME/ninfer, else ~/.cache/ninfer."""
    root = os.environ.get("NINFER_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "ninfer" if xdg else Path.home() / ".cache" / "ninfer"
