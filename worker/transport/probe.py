"""Container health probe: ``python -m worker.transport.probe URL`` exits 0 when the target answers.

Used by the healthchecks of ``compose.yaml`` and ``ops/compose.local.yaml``. Every argument is one
word with no whitespace, because podman 4.3's Docker-compatible API splits a ``CMD`` healthcheck's
arguments at whitespace (a ``python -c "import ...; ..."`` check then fails with ``SyntaxError``;
see ``ops/README.md``, "Compose (one host)").

``URL`` forms:

- ``http://HOST:PORT/PATH`` (or ``https``): GET; exit 0 on a 2xx status, else 1 with one line
  (status and the first line of the body, e.g. ``not ready: starting``);
- ``tcp://HOST:PORT``: exit 0 when a TCP connection opens (a broker or Redis port), else 1.

``--timeout`` (seconds, default 3, bounded to 0.1..60). A malformed URL is exit 2. Standard library
only, so the probe starts in well under a second and imports nothing of the worker.
"""
from __future__ import annotations

import argparse
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["probe", "main"]

TIMEOUT_MIN, TIMEOUT_MAX = 0.1, 60.0


def probe(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    """Check ``url`` once (forms above); ``timeout`` in seconds. Returns ``(ok, one-line detail)``.
    Raises ``ValueError`` for a URL with an unknown scheme or no host/port."""
    u = urllib.parse.urlsplit(url)
    if u.scheme == "tcp":
        if not u.hostname or u.port is None:
            raise ValueError(f"tcp URL needs host and port: {url!r}")
        try:
            with socket.create_connection((u.hostname, u.port), timeout=timeout):
                return True, f"{u.hostname}:{u.port} accepts connections"
        except OSError as e:
            return False, f"{u.hostname}:{u.port}: {e}"
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"expected http://, https:// or tcp:// URL with a host: {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - scheme checked above
            return True, f"{resp.status}"
    except urllib.error.HTTPError as e:
        body = e.read(512).decode("utf-8", "replace").strip().splitlines()
        return False, f"{e.code} {body[0] if body else ''}".strip()
    except (urllib.error.URLError, OSError) as e:
        return False, f"{url}: {getattr(e, 'reason', e)}"


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m worker.transport.probe [--timeout S] URL``. Returns 0 (healthy),
    1 (not healthy, one line on stderr) or 2 (bad arguments)."""
    ap = argparse.ArgumentParser(prog="python -m worker.transport.probe", description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--timeout", type=float, default=3.0)
    args = ap.parse_args(argv)
    timeout = min(max(args.timeout, TIMEOUT_MIN), TIMEOUT_MAX)
    try:
        ok, detail = probe(args.url, timeout)
    except ValueError as e:
        print(f"probe: {e}", file=sys.stderr)
        return 2
    if not ok:
        print(f"probe: not healthy: {detail}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
