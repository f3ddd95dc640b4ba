"""Logging setup of every subcommand: ``--log-format text`` (default) or ``json``.

* ``text``: ``<time> <LEVEL> <logger>: <message>`` plus ``key=value`` for record fields.
* ``json``: one JSON object per line (a traceback is the ``exc_info`` string of the same object),
  keys ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``, then the
  fields passed with ``extra=`` (``record_fields``): the record coordinates ``topic``,
  ``partition``, ``offset`` and ``request_id`` when logging about a record, and any other
  JSON-able ``extra`` key.

No secrets: user:password in URLs (``redis://u:secret@host``) is replaced by ``u:***`` in every
message and field (``redact``), in both formats. Stdlib ``logging`` only.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any

_URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s/]+)@")

#: attributes every ``LogRecord`` has: anything else on a record came from ``extra=``
_STANDARD = frozenset(vars(logging.LogRecord("n", 0, "p", 0, "m", None, None))) | {"message", "asctime", "taskName"}

#: fields shown first, in this order, when present
RECORD_FIELDS = ("topic", "partition", "offset", "request_id")


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` URL replaced by ``***``."""
    if "://" not in text:
        return text
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def record_fields(topic: str | None = None, partition: int | None = None, offset: int | None = None,
                  request_id: str | None = None, **more: Any) -> dict[str, Any]:
    """``extra=`` dict for a log call about one Kafka record (None values dropped)."""
    d = {"topic": topic, "partition": partition, "offset": offset, "request_id": request_id, **more}
    return {k: v for k, v in d.items() if v is not None}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    extra = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    ordered = {k: extra.pop(k) for k in RECORD_FIELDS if k in extra}
    ordered.update(sorted(extra.items()))
    return ordered


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return redact(v) if isinstance(v, str) else v
    if isinstance(v, bytes):
        return redact(v.decode("utf-8", "replace"))
    return redact(str(v))


class JsonFormatter(logging.Formatter):
    """One JSON object per record (module docstring); never raises on odd ``extra`` values."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a one-line JSON object."""
        t = record.created
        obj: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for k, v in _fields(record).items():
            obj.setdefault(k, _jsonable(v))
        if record.exc_info:
            obj["exc_info"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            obj["stack_info"] = redact(self.formatStack(record.stack_info))
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> key=value ...`` with URL passwords redacted."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The record as text (a traceback on the following lines, as stdlib logging does)."""
        s = super().format(record)
        fields = _fields(record)
        if fields:
            head, sep, tail = s.partition("\n")
            s = head + " " + " ".join(f"{k}={_jsonable(v)}" for k, v in fields.items()) + sep + tail
        return redact(s)


def setup_logging_from_env() -> None:
    """``setup_logging`` with ``DERENDER_LOG_LEVEL``/``DERENDER_LOG_FORMAT`` (default INFO/text;
    unknown values fall back to the defaults): for pool processes, which inherit the environment
    the CLI exported (``export_log_settings``), so their lines match the parent's format."""
    level = os.environ.get("DERENDER_LOG_LEVEL", "INFO").strip().upper()
    fmt = os.environ.get("DERENDER_LOG_FORMAT", "text").strip().lower()
    known = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
    setup_logging(level if level in known else "INFO", "json" if fmt == "json" else "text")


def export_log_settings(level: str, fmt: str) -> None:
    """Put the resolved log level/format into this process' environment for its pool processes."""
    os.environ["DERENDER_LOG_LEVEL"] = level
    os.environ["DERENDER_LOG_FORMAT"] = fmt


def setup_logging(level: str = "INFO", fmt: str = "text", stream=None) -> None:
    """Configure the root logger once per process: ``level`` (``DEBUG``...``CRITICAL``), ``fmt``
    ``text`` or ``json``, on ``stream`` (default stderr). Replaces handlers set earlier."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
