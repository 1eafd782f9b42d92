"""Where media bytes come from: data: URLs, local files under the allowed directory, and http(s)
fetches checked against SSRF (resolve once, refuse non-public addresses, connect to the checked
address, check every redirect again, bound the time and the bytes)."""
from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import os
import socket
import ssl
import time
import urllib.parse
from pathlib import Path

from ninfer.gateway.media.item import MediaError, MediaPolicy

_REDIRECTS = (301, 302, 303, 307, 308)


def parse_data_url(url: str, max_bytes: int) -> tuple[bytes, str]:
    """data:<mime>[;params];base64,<payload> -> (bytes, mime)."""
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaError("malformed data: URL (no ',' before the payload)")
    params = [p.strip().lower() for p in head.split(";")]
    mime = params[0] or "text/plain"
    if "base64" not in params[1:]:
        raise MediaError("data: URLs of media must be base64 (data:<mime>;base64,...)")
    payload = "".join(payload.split())
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise MediaError(f"the media is larger than the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the data: URL's payload is not valid base64") from None
    if not data:
        raise MediaError("the data: URL is empty")
    return data, mime


def read_local(source: str, policy: MediaPolicy) -> bytes:
    """A file:// URL or a path, only inside `allowed_local_path` (after resolving symlinks and '..')."""
    root = policy.allowed_local_path
    if root is None:
        raise MediaError("local files are not allowed: start the server with --allowed-local-media-path DIR")
    if source.lower().startswith("file:"):
        parsed = urllib.parse.urlparse(source)
        if parsed.netloc not in ("", "localhost"):
            raise MediaError(f"file: URLs name no host, got {parsed.netloc!r}")
        path_text = urllib.parse.unquote(parsed.path)
    else:
        path_text = source
    path = Path(path_text)
    if not path.is_absolute():
        path = root / path
    try:
        # NOTE: containment first, whether or not the file exists (no existence oracle outside root)
        real = path.resolve(strict=False)
    except (OSError, RuntimeError):
        raise MediaError(f"cannot resolve the media path {path_text}") from None
    if not real.is_relative_to(root):
        raise MediaError(f"{path_text} is outside the allowed media path")
    if not real.exists():
        raise MediaError(f"no such file under the allowed media path: {path_text}")
    if not real.is_file():
        raise MediaError(f"{path_text} is not a regular file")
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise MediaError(f"cannot read {path_text}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        # NOTE: what was opened is checked again (a path swapped after the check stays refused)
        opened = Path(f"/proc/self/fd/{fd}")
        if opened.exists() and not Path(os.readlink(opened)).is_relative_to(root):
            raise MediaError(f"{path_text} is outside the allowed media path")
        size = os.fstat(fd).st_size
        if size > policy.max_bytes:
            raise MediaError(f"{path_text} has {size} bytes, over the limit of {policy.max_bytes}")
        data = f.read(policy.max_bytes + 1)
    if len(data) > policy.max_bytes:
        raise MediaError(f"{path_text} is over the limit of {policy.max_bytes} bytes")
    return data


# ---------------------------------------------------------------------------------------------
# Remote fetch (no SSRF)
# ---------------------------------------------------------------------------------------------
def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (module-level, so that tests can replace it)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def address_refused(addr: str) -> str | None:
    """Why an address may not be fetched from (None: a public unicast address)."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    # NOTE: the specific classes first: ipaddress counts most of them as private too
    for what, bad in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                      ("multicast", ip.is_multicast), ("unspecified", ip.is_unspecified),
                      ("reserved", ip.is_reserved), ("private", ip.is_private),
                      ("non-global", not ip.is_global)):
        if bad:
            return what
    return None


def _check_url(url: str, policy: MediaPolicy) -> tuple[str, str, int, str]:
    """(scheme, host, port, checked address) of a URL the policy lets us fetch."""
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.lower()
    if scheme not in ("http", "https"):
        raise MediaError(f"unsupported URL scheme {scheme!r} (http, https)")
    if not policy.remote:
        raise MediaError("remote media URLs are not allowed: start the server with --allowed-media-domains "
                         "DOMAIN... or --allow-remote-media")
    if parsed.username or parsed.password:
        raise MediaError("media URLs may not carry credentials")
    host = (parsed.hostname or "").lower().rstrip(".")
    if not host:
        raise MediaError("the media URL has no host")
    if policy.allowed_domains and not policy.allow_remote and host not in policy.allowed_domains:
        raise MediaError(f"the host {host!r} is not in --allowed-media-domains")
    try:
        port = parsed.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise MediaError("the media URL has an invalid port") from None
    try:
        addrs = resolve(host, port)
    except (socket.gaierror, UnicodeError, OSError):
        raise MediaError(f"cannot resolve the media host {host!r}") from None
    if not addrs:
        raise MediaError(f"cannot resolve the media host {host!r}")
    if not policy.allow_private_addresses:
        for a in addrs:
            why = address_refused(a)
            if why is not None:
                raise MediaError(f"the media host {host!r} resolves to {a} ({why} address); refused")
    return scheme, host, port, addrs[0]


def tls_context() -> ssl.SSLContext:
    """The system's trust store, certificate and host name verification on (tests replace it)."""
    return ssl.create_default_context()


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address, verifying the certificate against the URL's host name."""

    def __init__(self, address: str, host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout, context=tls_context())
        self._address = address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, address: str, host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


def fetch(url: str, policy: MediaPolicy) -> bytes:
    """GET an http(s) URL under the policy: checked hosts and addresses, redirects, time and bytes."""
    deadline = time.monotonic() + policy.timeout_s
    for hop in range(policy.max_redirects + 1):
        scheme, host, port, address = _check_url(url, policy)
        left = deadline - time.monotonic()
        if left <= 0:
            raise MediaError(f"fetching the media timed out after {policy.timeout_s:g}s")
        cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
        conn = cls(address, host, port, timeout=left)
        try:
            parsed = urllib.parse.urlsplit(url)
            target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
            conn.request("GET", target, headers={"User-Agent": "ninfer", "Accept": "image/*, video/*",
                                                 "Accept-Encoding": "identity"})
            resp = conn.getresponse()
            if resp.status in _REDIRECTS:
                location = resp.getheader("Location")
                if not location:
                    raise MediaError(f"the media URL answered {resp.status} without a Location")
                url = urllib.parse.urljoin(url, location)
                continue
            if resp.status != 200:
                raise MediaError(f"fetching the media failed: HTTP {resp.status}")
            length = resp.getheader("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > policy.max_bytes:
                raise MediaError(f"the media has {int(length)} bytes, over the limit of {policy.max_bytes}")
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise MediaError(f"fetching the media timed out after {policy.timeout_s:g}s")
                if conn.sock is not None:
                    conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = resp.read1(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > policy.max_bytes:
                    raise MediaError(f"the media is larger than the limit of {policy.max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        except socket.timeout:
            raise MediaError(f"fetching the media timed out after {policy.timeout_s:g}s") from None
        except (OSError, http.client.HTTPException) as e:
            raise MediaError(f"fetching the media failed: {type(e).__name__}") from None
        finally:
            conn.close()
    raise MediaError(f"the media URL redirected more than {policy.max_redirects} times")
