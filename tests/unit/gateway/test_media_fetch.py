"""Where media may come from (ninfer/gateway/media/): http(s) only when allowed, never to a private,
loopback, link-local, multicast or reserved address (checked after DNS, each redirect again), within
the redirect, byte and time limits; local files only inside the allowed directory. All offline: DNS
is replaced, and the only server is on loopback."""
from __future__ import annotations

import os
import threading
import time

import pytest

from ninfer.gateway import media as M
from ninfer.gateway.media import sources as S
from support.media_util import (RecordingServer, image_bytes, redirect, send_body, send_unsized, stall)

PNG = image_bytes()


def _resolve_to(monkeypatch, table: dict[str, list[str]]):
    calls = []

    def fake(host, port):
        calls.append(host)
        if host not in table:
            raise OSError("no such host")
        return table[host]
    monkeypatch.setattr(S, "resolve", fake)
    return calls


def _loopback_is_public(monkeypatch):
    """Let the loopback test server stand for a public host (only 127.0.0.1; every other check stays)."""
    real = S.address_refused
    monkeypatch.setattr(S, "address_refused", lambda a: None if a == "127.0.0.1" else real(a))


@pytest.mark.parametrize("addr, what", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"), ("172.16.0.5", "private"),
    ("192.168.1.1", "private"), ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("240.0.0.1", "reserved"), ("0.0.0.0", "unspecified"),
    ("100.64.0.1", "non-global"), ("::ffff:10.0.0.1", "private"), ("fc00::1", "private"),
])
def test_non_public_addresses_are_refused_after_dns(monkeypatch, addr, what):
    _resolve_to(monkeypatch, {"img.example.com": [addr]})
    policy = M.MediaPolicy(allowed_domains=("img.example.com",))
    with pytest.raises(M.MediaError, match=rf"resolves to .* \({what} address\)"):
        M.load_media("image", "http://img.example.com/a.png", policy)


def test_any_refused_address_among_several_refuses(monkeypatch):
    _resolve_to(monkeypatch, {"a.example.com": ["93.184.216.34", "10.0.0.7"]})
    with pytest.raises(M.MediaError, match=r"\(private address\)"):
        M.fetch("https://a.example.com/x.png", M.MediaPolicy(allow_remote=True))
    assert M.address_refused("93.184.216.34") is None and M.address_refused("2606:4700::1111") is None


def test_default_policy_fetches_nothing_and_resolves_nothing(monkeypatch):
    calls = _resolve_to(monkeypatch, {"img.example.com": ["93.184.216.34"]})
    with pytest.raises(M.MediaError, match="remote media URLs are not allowed"):
        M.load_media("image", "https://img.example.com/a.png", M.MediaPolicy())
    with pytest.raises(M.MediaError, match="local files are not allowed"):
        M.load_media("image", "file:///etc/hostname", M.MediaPolicy())
    with pytest.raises(M.MediaError, match="local files are not allowed"):
        M.load_media("image", "/etc/hostname", M.MediaPolicy())
    assert calls == []


def test_domain_allowlist_is_exact(monkeypatch):
    calls = _resolve_to(monkeypatch, {})
    policy = M.MediaPolicy(allowed_domains=("Img.Example.com",))
    for url in ("http://evil.com/a.png", "http://img.example.com.evil.com/a.png", "http://example.com/a.png",
                "http://sub.img.example.com/a.png"):
        with pytest.raises(M.MediaError, match="not in --allowed-media-domains"):
            M.load_media("image", url, policy)
    with pytest.raises(M.MediaError, match="credentials"):
        M.load_media("image", "http://user:pw@img.example.com/a.png", policy)
    assert calls == []


def test_fetch_connects_to_the_checked_address(monkeypatch):
    """The name is resolved once; the connection goes to that address (no second lookup to rebind)."""
    _loopback_is_public(monkeypatch)
    with RecordingServer({"/a.png": send_body(PNG, "image/png")}) as srv:
        calls = _resolve_to(monkeypatch, {"img.example.com": ["127.0.0.1"]})
        item = M.load_media("image", f"http://img.example.com:{srv.port}/a.png",
                            M.MediaPolicy(allowed_domains=("img.example.com",)))
    assert item.size == (32, 24) and item.source == f"http://img.example.com:{srv.port}/a.png"
    assert calls == ["img.example.com"] and srv.requests == ["/a.png"]


def test_redirects_are_checked_each_hop(monkeypatch):
    _loopback_is_public(monkeypatch)
    _resolve_to(monkeypatch, {"img.example.com": ["127.0.0.1"], "internal.example.com": ["10.0.0.9"]})
    with RecordingServer() as srv:
        base = f"http://img.example.com:{srv.port}"
        srv.routes.update({"/ok": redirect("/hop1"), "/hop1": redirect(f"{base}/a.png", 307),
                           "/a.png": send_body(PNG), "/to-private": redirect("http://internal.example.com/x"),
                           "/to-other": redirect("http://other.example.com/x"),
                           "/loop": redirect("/loop"), "/to-ftp": redirect("ftp://img.example.com/x"),
                           "/no-location": lambda h: (h.send_response(302), h.send_header("Content-Length", "0"),
                                                      h.end_headers())})
        allow = M.MediaPolicy(allowed_domains=("img.example.com", "internal.example.com"), max_redirects=2)
        assert M.load_media("image", f"{base}/ok", allow).size == (32, 24)
        with pytest.raises(M.MediaError, match=r"\(private address\)"):
            M.fetch(f"{base}/to-private", allow)
        with pytest.raises(M.MediaError, match="'other.example.com' is not in --allowed-media-domains"):
            M.fetch(f"{base}/to-other", allow)
        with pytest.raises(M.MediaError, match="redirected more than 2 times"):
            M.fetch(f"{base}/loop", allow)
        assert srv.requests.count("/loop") == 3
        with pytest.raises(M.MediaError, match="unsupported URL scheme 'ftp'"):
            M.fetch(f"{base}/to-ftp", allow)
        with pytest.raises(M.MediaError, match="without a Location"):
            M.fetch(f"{base}/no-location", allow)
        with pytest.raises(M.MediaError, match="redirected more than 0 times"):
            M.fetch(f"{base}/ok", M.MediaPolicy(allowed_domains=("img.example.com",), max_redirects=0))


def test_byte_cap_status_and_timeout():
    big = b"\0" * 5000
    with RecordingServer({"/sized": send_body(big), "/lying": send_body(big[:100], length=5000),
                          "/unsized": send_unsized(big, chunk=500), "/slow": stall(3.0),
                          "/ok": send_body(PNG)}) as srv:
        policy = M.MediaPolicy(allow_remote=True, allow_private_addresses=True, max_bytes=1000, timeout_s=0.4)
        with pytest.raises(M.MediaError, match="5000 bytes, over the limit of 1000"):
            M.fetch(f"{srv.base}/sized", policy)
        with pytest.raises(M.MediaError, match="5000 bytes, over the limit of 1000"):
            M.fetch(f"{srv.base}/lying", policy)
        with pytest.raises(M.MediaError, match="larger than the limit of 1000 bytes"):
            M.fetch(f"{srv.base}/unsized", policy)
        with pytest.raises(M.MediaError, match="HTTP 404"):
            M.fetch(f"{srv.base}/missing", policy)
        t0 = time.monotonic()
        with pytest.raises(M.MediaError, match="timed out after 0.4s"):
            M.fetch(f"{srv.base}/slow", policy)
        assert time.monotonic() - t0 < 2.0
        assert M.fetch(f"{srv.base}/ok", policy) == PNG


def test_fetch_leaves_no_socket_or_thread_open():
    def fds() -> int:
        return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    with RecordingServer({"/ok": send_body(PNG), "/big": send_body(b"\0" * 5000)}) as srv:
        policy = M.MediaPolicy(allow_remote=True, allow_private_addresses=True, max_bytes=1000)
        M.fetch(f"{srv.base}/ok", policy)
        before_fds, before_threads = fds(), threading.active_count()
        for _ in range(5):
            M.fetch(f"{srv.base}/ok", policy)
            with pytest.raises(M.MediaError):
                M.fetch(f"{srv.base}/big", policy)
        # NOTE: the loopback server (same process) closes its side a moment after the client
        deadline = time.monotonic() + 3.0
        while (fds() > before_fds or threading.active_count() > before_threads) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fds() <= before_fds and threading.active_count() <= before_threads


# ---------------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------------
def test_local_files_only_inside_the_allowed_directory(tmp_path):
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.png").write_bytes(PNG)
    outside = tmp_path / "secret.png"
    outside.write_bytes(PNG)
    (root / "link.png").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    policy = M.MediaPolicy(allowed_local_path=root)
    assert M.load_media("image", f"file://{root}/sub/a.png", policy).size == (32, 24)
    assert M.load_media("image", "sub/a.png", policy).source == "sub/a.png"
    assert M.load_media("image", f"file://{root}/sub/../sub/a.png", policy).size == (32, 24)
    for src in (f"file://{outside}", str(outside), "../secret.png", f"file://{root}/../secret.png",
                f"file://{root}/link.png", f"file://{root}/dirlink/secret.png", "sub/../../secret.png",
                f"file://{root}/%2e%2e/secret.png", f"file://{tmp_path}/missing.png", "../nope/x.png"):
        with pytest.raises(M.MediaError, match="outside the allowed media path"):
            M.load_media("image", src, policy)
    with pytest.raises(M.MediaError, match="no such file"):
        M.load_media("image", f"file://{root}/nope.png", policy)
    with pytest.raises(M.MediaError, match="not a regular file"):
        M.load_media("image", f"file://{root}/sub", policy)
    with pytest.raises(M.MediaError, match="name no host"):
        M.load_media("image", f"file://otherhost{root}/sub/a.png", policy)
    with pytest.raises(M.MediaError, match="over the limit of 10"):
        M.load_media("image", "sub/a.png", M.MediaPolicy(allowed_local_path=root, max_bytes=10))
    with pytest.raises(ValueError, match="is not a directory"):
        M.MediaPolicy(allowed_local_path=tmp_path / "missing")


def test_load_file_reads_what_the_cli_names(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(PNG)
    assert M.load_file("image", p, M.MediaPolicy()).source == str(p)
    with pytest.raises(M.MediaError, match="no such file"):
        M.load_file("image", tmp_path / "b.png", M.MediaPolicy())
    with pytest.raises(M.MediaError, match="not a regular file"):
        M.load_file("image", tmp_path, M.MediaPolicy())


def _tls_server(tmp_path, name: str):
    """A loopback HTTPS server with a self-signed certificate for `name` (skips without openssl)."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}"],
                   check=True, capture_output=True)
    srv = RecordingServer({"/a.png": send_body(PNG, "image/png")})
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.httpd.socket = ctx.wrap_socket(srv.httpd.socket, server_side=True)
    return srv, cert


def test_https_goes_to_the_checked_address_and_verifies_the_host_name(monkeypatch, tmp_path):
    import ssl

    srv, cert = _tls_server(tmp_path, "img.example.com")
    _loopback_is_public(monkeypatch)
    _resolve_to(monkeypatch, {"img.example.com": ["127.0.0.1"], "other.example.com": ["127.0.0.1"]})
    policy = M.MediaPolicy(allowed_domains=("img.example.com", "other.example.com"))
    with srv:
        # an unknown issuer is refused: certificates are verified
        with pytest.raises(M.MediaError, match="fetching the media failed: SSLCertVerificationError"):
            M.fetch(f"https://img.example.com:{srv.port}/a.png", policy)
        monkeypatch.setattr(S, "tls_context", lambda: ssl.create_default_context(cafile=str(cert)))
        assert M.fetch(f"https://img.example.com:{srv.port}/a.png", policy) == PNG
        # the certificate must name the URL's host, not merely the address connected to
        with pytest.raises(M.MediaError, match="SSLCertVerificationError"):
            M.fetch(f"https://other.example.com:{srv.port}/a.png", policy)
    assert srv.requests == ["/a.png"]


def test_https_to_a_plain_http_server_fails_cleanly():
    with RecordingServer({"/a.png": send_body(PNG)}) as srv:
        policy = M.MediaPolicy(allow_remote=True, allow_private_addresses=True, timeout_s=2)
        with pytest.raises(M.MediaError, match="fetching the media failed: SSL"):
            M.fetch(f"https://127.0.0.1:{srv.port}/a.png", policy)
