"""TLS files given on the command line (Kafka ``--ssl-*``, Redis ``--redis-tls-*``), checked at
start so that a wrong path or a bad PEM file is one error line naming the flag and the file,
not an ``[SSL] PEM lib (_ssl.c:...)`` or a bare ``[Errno 2]`` during connect (which the worker
would also take for an outage and retry until its deadline).

``check_tls_files`` loads the files into a throw-away ``ssl.SSLContext`` the way the clients do
(``load_verify_locations`` for the CA bundle, ``load_cert_chain`` for the client certificate and
key; sources: ``aiokafka.helpers.create_ssl_context``, redis-py's ``SSLConnection``).
"""
from __future__ import annotations

import ssl

__all__ = ["check_tls_files"]

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY = b"PRIVATE KEY-----"
_MAX_PEM_BYTES = 1 << 20  # a CA bundle is tens of KB; reading more only to sniff the markers is pointless


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_PEM_BYTES)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot read it: {e.strerror or e}") from None


def _reason(e: Exception) -> str:
    return getattr(e, "reason", None) or str(e) or type(e).__name__


def check_tls_files(cafile: str | None, certfile: str | None, keyfile: str | None, password: str | None = None,
                    *, flags: tuple[str, str, str]) -> None:
    """Load the CA bundle ``cafile`` and the client ``certfile``/``keyfile`` pair (each optional;
    a key without a certificate is refused) as a TLS client would. ``flags``: the names of the
    three options, in that order, for the message. Raises ``ValueError`` naming the flag and the
    file: missing or unreadable, not PEM of the expected kind, a key that does not match the
    certificate or whose ``password`` is wrong."""
    ca_flag, cert_flag, key_flag = flags
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cafile:
        data = _read(ca_flag, cafile)
        try:
            ctx.load_verify_locations(cafile=cafile)
        except (ssl.SSLError, OSError, ValueError) as e:
            raise ValueError(f"{ca_flag} {cafile}: not a PEM CA bundle ({_reason(e)})"
                             + ("" if _PEM_CERT in data else ": it holds no BEGIN CERTIFICATE block")) from None
    if keyfile and not certfile:
        raise ValueError(f"{key_flag} {keyfile} needs {cert_flag} (the client certificate it belongs to)")
    if certfile:
        cert = _read(cert_flag, certfile)
        key = _read(key_flag, keyfile) if keyfile else cert
        if _PEM_CERT not in cert:
            raise ValueError(f"{cert_flag} {certfile}: not a PEM certificate (no BEGIN CERTIFICATE block)")
        if _PEM_KEY not in key:
            where = f"{key_flag} {keyfile}" if keyfile else f"{cert_flag} {certfile} (no {key_flag} given)"
            raise ValueError(f"{where}: not a PEM private key (no BEGIN ... PRIVATE KEY block)")
        try:
            ctx.load_cert_chain(certfile, keyfile, password)
        except (ssl.SSLError, OSError, ValueError) as e:
            pair = f"{cert_flag} {certfile}" + (f" and {key_flag} {keyfile}" if keyfile else "")
            raise ValueError(f"{pair}: cannot load the certificate and key ({_reason(e)}: a key that does not "
                             f"match the certificate, an encrypted key with a wrong or missing password, or "
                             f"a damaged PEM block)") from None
