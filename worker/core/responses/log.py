"""The append-only log of a Responses stream: everything that grows with the output.

The per-chunk stream state (``ResponsesStreamState``) stays small (sequence numbers, the open
item's ids, the detokenizer window, the parser's buffers); what grows with the output is
appended here instead and read back only when it is needed (when an item closes: its text;
at the terminal event: every closed item), so a chunk's cost does not grow with the output.

Records, one per line (``\\n``-terminated; JSON never holds a raw newline):

* ``t<json string>``: text appended to the open item (message text, reasoning text or call
  arguments);
* ``l<json list>``: final-form logprob entries (``ResponseLogprob``) appended to the open
  message's part;
* ``i<json item>``: a closed output item, in output order;
* ``p<json list>``: logprob entries of tokens that produced no text yet, spilled from the state
  (``ResponsesStreamState.pend_at``); read back only when message text follows them.

The open item's records start at ``OpenItem.log_start``. The state records the log's length
after each chunk (``ResponsesStreamState.log_len``), so a reader truncates to it: a log
appended twice for one chunk (a crash between the append and the state write) reads the same.

``PieceLog`` is the core's view: the bytes persisted before this chunk (read through the
caller's ``reader(start, end)``, no I/O here) plus this chunk's new records (``new``, which the
caller appends to its store: ``worker.state`` for Redis, memory for batch).
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

from schemas.responses import OutputItem, ResponseLogprob

__all__ = ["PieceLog", "MemoryLog", "Reader", "memory_reader", "PiecesNeeded", "PiecesLost", "MAX_PIECES_LEN"]

Reader = Callable[[int, int], bytes]

#: the longest piece log (or chat pieces) a state may record: Redis's largest string
#: (``proto-max-bulk-len``, 512 MiB); a stored state recording more is refused as unreadable
MAX_PIECES_LEN = 512 * 1024 * 1024

_enc = msgspec.json.Encoder()
_item_dec = msgspec.json.Decoder(OutputItem)
_lp_dec = msgspec.json.Decoder(list[ResponseLogprob])
_str_dec = msgspec.json.Decoder(str)


class PiecesNeeded(Exception):
    """The chunk needs persisted log bytes ``[start, end)`` and no reader was given: call again
    with a reader over them (a transport that ships the log to its derender pool only when an
    item closes or the stream ends; most chunks need none)."""

    def __init__(self, start: int, end: int):
        super().__init__(f"piece log bytes [{start}, {end}) needed")
        self.start, self.end = start, end


class PiecesLost(Exception):
    """The reader returned fewer bytes than the state records, or bytes that do not decode as
    what was written (a chat stream's spilled call body: not UTF-8 or not as many characters):
    the stream's pieces were lost (expired, deleted, truncated, overwritten); the stream cannot
    go on (the service answers the 409 "lost or expired")."""


_TAGS = frozenset(b"tlip")


def _corrupted(why: object) -> PiecesLost:
    return PiecesLost(f"the stream's piece log is corrupted ({why}): it was lost or expired, or overwritten")


def _records(data: bytes) -> list[bytes]:
    """The records of log bytes read from a record boundary to one (``\\n``-terminated, each
    starting with a known tag). Raises ``PiecesLost`` for bytes that are not such records: the
    store's log was overwritten or damaged (its garbage is never read as an empty log)."""
    if not data:
        return []
    if data[-1] != 0x0A:
        raise _corrupted("it does not end at a record boundary")
    lines = data[:-1].split(b"\n")
    for line in lines:
        if not line or line[0] not in _TAGS:
            raise _corrupted(f"a record starts with {line[:1]!r}")
    return lines


def memory_reader(data: bytes | bytearray) -> Reader:
    """A ``Reader`` over bytes held in memory."""
    return lambda start, end: bytes(data[start:end])


class PieceLog:
    """The log as one chunk sees it: ``base_len`` persisted bytes behind ``reader`` plus the
    records this chunk appends (``new``). Offsets are absolute (persisted + new)."""

    __slots__ = ("reader", "base_len", "new", "_new_items")

    def __init__(self, reader: Reader | None, base_len: int):
        self.reader = reader
        self.base_len = base_len
        self.new = bytearray()
        self._new_items: list[OutputItem] = []  # items closed in this chunk (never decoded back)

    def __len__(self) -> int:
        return self.base_len + len(self.new)

    def append_text(self, text: str) -> None:
        """Record ``text`` as appended to the open item."""
        self.new += b"t" + _enc.encode(text) + b"\n"

    def append_logprobs(self, entries: list[ResponseLogprob]) -> None:
        """Record final-form logprob entries of the open message."""
        if entries:
            self.new += b"l" + _enc.encode(entries) + b"\n"

    def append_pending(self, entries: list[ResponseLogprob]) -> None:
        """Record logprob entries waiting for text (spilled from the state)."""
        if entries:
            self.new += b"p" + _enc.encode(entries) + b"\n"

    def pending(self, start: int) -> list[ResponseLogprob]:
        """The waiting entries recorded from ``start`` on (``p`` records), in order."""
        out: list[ResponseLogprob] = []
        try:
            for line in _records(self.read(start)):
                if line[:1] == b"p":
                    out.extend(_lp_dec.decode(line[1:]))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise _corrupted(e) from None
        return out

    def append_item(self, item: OutputItem) -> None:
        """Record a closed output item."""
        self.new += b"i" + _enc.encode(item) + b"\n"
        self._new_items.append(item)

    def read(self, start: int, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the log (``end`` None: to the end). Raises ``PiecesNeeded``
        when persisted bytes are needed and the caller gave no reader, ``PiecesLost`` when the
        reader returned fewer bytes than the state recorded."""
        end = len(self) if end is None else end
        out = bytearray()
        if start < self.base_len:
            stop = min(end, self.base_len)
            if self.reader is None:
                raise PiecesNeeded(start, stop)
            got = self.reader(start, stop)
            if len(got) != stop - start:
                raise PiecesLost(f"the stream's piece log is shorter than its state records "
                                 f"({start + len(got)} < {stop} bytes): it was lost or expired")
            out += got
        if end > self.base_len:
            out += self.new[max(start - self.base_len, 0):end - self.base_len]
        return bytes(out)

    def open_item(self, start: int) -> tuple[str, list[ResponseLogprob]]:
        """The open item's text and logprob entries (records from ``start`` on)."""
        texts: list[str] = []
        entries: list[ResponseLogprob] = []
        try:
            for line in _records(self.read(start)):
                if line[:1] == b"t":
                    texts.append(_str_dec.decode(line[1:]))
                elif line[:1] == b"l":
                    entries.extend(_lp_dec.decode(line[1:]))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise _corrupted(e) from None
        return "".join(texts), entries

    def items(self) -> list[OutputItem]:
        """Every closed item, in output order (reads the persisted log: once, for the terminal
        event; items closed in this chunk are taken as they are)."""
        old = self.read(0, self.base_len) if self.base_len else b""
        try:
            return [_item_dec.decode(line[1:]) for line in _records(old) if line[:1] == b"i"] + self._new_items
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise _corrupted(e) from None


class MemoryLog:
    """``PieceLog``'s interface over Python objects, for a view built in one call and never
    persisted (the non-streaming Responses and Messages views): no JSON round trip of the
    text, entries and items (the same values: a ``str`` and the floored logprob floats
    encode and decode to themselves). Offsets count records, not bytes; ``new`` stays empty."""

    __slots__ = ("_tags", "_vals", "new", "base_len")

    def __init__(self) -> None:
        self._tags: list[str] = []
        self._vals: list = []
        self.new = b""
        self.base_len = 0

    def __len__(self) -> int:
        return len(self._tags)

    def append_text(self, text: str) -> None:
        """Record ``text`` as appended to the open item."""
        self._tags.append("t")
        self._vals.append(text)

    def append_logprobs(self, entries: list[ResponseLogprob]) -> None:
        """Record final-form logprob entries of the open message."""
        if entries:
            self._tags.append("l")
            self._vals.append(list(entries))

    def append_pending(self, entries: list[ResponseLogprob]) -> None:
        """Record logprob entries waiting for text."""
        if entries:
            self._tags.append("p")
            self._vals.append(list(entries))

    def pending(self, start: int) -> list[ResponseLogprob]:
        """The waiting entries recorded from ``start`` on, in order."""
        out: list[ResponseLogprob] = []
        for tag, v in zip(self._tags[start:], self._vals[start:]):
            if tag == "p":
                out.extend(v)
        return out

    def append_item(self, item: OutputItem) -> None:
        """Record a closed output item."""
        self._tags.append("i")
        self._vals.append(item)

    def open_item(self, start: int) -> tuple[str, list[ResponseLogprob]]:
        """The open item's text and logprob entries (records from ``start`` on)."""
        texts: list[str] = []
        entries: list[ResponseLogprob] = []
        for tag, v in zip(self._tags[start:], self._vals[start:]):
            if tag == "t":
                texts.append(v)
            elif tag == "l":
                entries.extend(v)
        return "".join(texts), entries

    def items(self) -> list[OutputItem]:
        """Every closed item, in output order."""
        return [v for tag, v in zip(self._tags, self._vals) if tag == "i"]
