"""Passwords read from files (``--sasl-password-file``, ``--redis-password-file``,
``--ssl-password-file``): a password given as a flag is in ``/proc/PID/cmdline``, which every user
of the host can read (``ps``); a file (a Kubernetes Secret mounted as a volume, a Docker secret
under ``/run/secrets``) or the flag's ``DERENDER_*`` variable (``/proc/PID/environ`` is readable by
the same user and root only) is not.

``secret`` returns the password of one flag from its value or its file, read once at start; the
file's content is the password, one trailing line break removed (``echo pw > file`` and
``kubectl create secret --from-file`` keep one). Errors name the flag and the file, never the
content.
"""
from __future__ import annotations

__all__ = ["secret", "MAX_SECRET_BYTES"]

#: largest password file read (bytes): a password, not a key bundle
MAX_SECRET_BYTES = 64 * 1024


def secret(flag: str, value: str | None, path: str | None) -> str | None:
    """The password of ``flag`` (e.g. ``--redis-password``): ``value`` when given, else the
    content of ``path`` (the ``<flag>-file`` flag) without its trailing line break, else None.
    Raises ``ValueError`` naming the flags when both are given, and naming ``<flag>-file`` and
    the file when it cannot be read, is empty, is larger than ``MAX_SECRET_BYTES`` or is not
    UTF-8 text."""
    if not path:
        return value
    file_flag = f"{flag}-file"
    if value:
        raise ValueError(f"{flag} and {file_flag} both given: keep one (the file is not visible to other users)")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{file_flag} {path}: cannot read it: {e.strerror or e}") from None
    if len(raw) > MAX_SECRET_BYTES:
        raise ValueError(f"{file_flag} {path}: larger than {MAX_SECRET_BYTES} bytes: not a password file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{file_flag} {path}: not UTF-8 text") from None
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text:
        raise ValueError(f"{file_flag} {path}: empty")
    return text
