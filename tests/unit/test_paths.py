"""ninfer/paths.py: files written through a temporary file and a rename get the mode the umask gives."""
from __future__ import annotations

import os

from ninfer.paths import current_umask, temp_file_beside


def test_a_temporary_file_for_an_atomic_write_has_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        fd, name = temp_file_beside(tmp_path / "out.bin")
        os.close(fd)
        os.replace(name, tmp_path / "out.bin")
    finally:
        os.umask(old)
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
