"""A module's scratch folder: for files too large to keep until the session ends (pytest removes
mktemp folders only when the whole run has passed)."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def scratch_dir(tmp_path_factory, name: str) -> Iterator[Path]:
    """A fresh folder `name<N>` under the run's base temp, removed (with what it holds) on exit.

    @pytest.fixture(scope="module")
    def artifact(tmp_path_factory):
        with scratch_dir(tmp_path_factory, "tool-script") as d:
            yield build(d / "m.ninfer")
    """
    path = tmp_path_factory.mktemp(name)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
