"""Logging setup of every subcommand: ``--log-format text`` (default) or ``json``.

* ``text``: ``<time> <LEVEL> <logger>: <message>`` plus ``key=value`` for record fields.
* ``json``: one JSON object per line (a traceback is the ``exc_info`` string of the same object),
  keys ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``, then the
  fields passed with ``extra=`` (``record_fields``): the record coordinates ``topic``,
  ``partition``, ``offset`` and ``request_id`` when logging about a record, and any other
  JSON-able ``extra`` key.

No secrets: user:password in URLs (``redis://u:secret@host``) is replaced by ``u:***`` in every
message and field (``redact``), in both formats. Stdlib ``logging`` only.

Rate limit: the Kafka client library (``aiokafka.*`` loggers) writes ~70 ERROR lines a second
while a broker is down (~20,000 over the default ``--broker-outage-deadline``), burying the
worker's own warning. ``RateLimitFilter`` lets one line per cause (logger, message template,
level) through per ``CLIENT_LOG_INTERVAL_S``; the next one after the interval carries the field
``suppressed=N`` (JSON: ``"suppressed": N``), the number of lines of that cause dropped since.
The worker's own loggers are never rate-limited.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
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


#: loggers whose lines are rate-limited (``RateLimitFilter``): the Kafka client library's
RATE_LIMITED_LOGGERS = ("aiokafka",)
#: seconds between two lines of one cause from those loggers
CLIENT_LOG_INTERVAL_S = 30.0


class RateLimitFilter(logging.Filter):
    """A handler filter letting through, for loggers under ``prefixes``, one record per cause
    (logger name, unformatted message, level) per ``interval_s`` seconds of ``clock``; the first
    record of a cause after its interval gets ``suppressed`` = the number dropped meanwhile (a
    field both formatters show). Other loggers pass untouched. At most ``max_causes`` causes are
    remembered (the oldest forgotten first), so a message built per call cannot grow memory.
    Thread safe."""

    def __init__(self, prefixes: tuple[str, ...] = RATE_LIMITED_LOGGERS, interval_s: float = CLIENT_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, max_causes: int = 256):
        super().__init__()
        self.prefixes = tuple(prefixes)
        self.interval_s = float(interval_s)
        self.clock = clock
        self.max_causes = max_causes
        self._causes: OrderedDict[tuple, list] = OrderedDict()  # cause -> [last emitted at, dropped since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """True to emit ``record`` (see the class docstring)."""
        name = record.name
        if not any(name == p or name.startswith(p + ".") for p in self.prefixes):
            return True
        cause = (name, str(record.msg), record.levelno)
        now = self.clock()
        with self._lock:
            seen = self._causes.get(cause)
            if seen is not None and now - seen[0] < self.interval_s:
                seen[1] += 1
                return False
            if seen is not None and seen[1]:
                record.suppressed = seen[1]
            self._causes[cause] = [now, 0]
            self._causes.move_to_end(cause)
            while len(self._causes) > self.max_causes:
                self._causes.popitem(last=False)
        return True


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
    ``text`` or ``json``, on ``stream`` (default stderr), the Kafka client library's lines
    rate-limited (``RateLimitFilter``). Replaces handlers set earlier."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RateLimitFilter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
