"""`ninfer serve` on an address it cannot bind fails at once with one line, before loading a model."""
from __future__ import annotations

import socket
import subprocess
import sys


def test_busy_port_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "ninfer", "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=60,
                              env={"NINFER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [f"ninfer serve: error: cannot listen on 127.0.0.1:{port}: Address already in use"], lines
    assert not any(tmp_path.iterdir())          # no demo model was built


def test_unresolvable_host_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ninfer", "serve", "--host", "no-such-host.invalid",
                           "--port", "8123"], capture_output=True, text=True, timeout=60,
                          env={"NINFER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "cannot resolve --host 'no-such-host.invalid'" in proc.stderr
