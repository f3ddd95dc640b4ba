"""Stored stream-state formats: what a release reads and which one it writes (issue 23 item 1;
operator procedure: docs/delivery.md, "Rolling upgrades across releases").

A *state format* (an int) names the layout of every value the Kafka worker persists for a stream:
the checkpoint (``worker.transport.checkpoints.Checkpoint``: envelope version, state, replay
window; a tombstone is one with state nil), the state inside it (chat/completion:
``worker.core.stream_state.StreamState``, first item its version; Responses: ``PIECES_MAGIC`` then
``ResponsesStreamState``, first item its version), the write-once settings (``StreamSettings``,
first item its version) and the pieces (append-only bytes without a header: their layout is the
one of the checkpoint that records their length). Format 6 = checkpoint envelope 1, chat state /
settings 6, Responses state 1 (release e8f2be2; golden blobs: ``tests/data/golden_state/v6``).

* ``FORMATS``: the formats this release reads, each a ``StateFormat`` (probe: is a stored value
  of this format; ``*_in``: its bytes to the layout this release's code works in, ``CURRENT``;
  ``*_out``: the other way). A release that changes the layout adds a format with its converters
  and keeps the previous one.
* ``select_write``: which format a worker writes: the newest one it reads that every live member
  reads (``advertised``: the members' advertisements in the store, ``RedisStateStore.
  advertise_formats``), and, unless the operator names a format (``--state-format``), one that
  the previous release reads (``PREVIOUS_READS``: members that advertise nothing, such as
  e8f2be2, are of that release).
* ``FormatSelector``: a worker's choice, refreshed with its advertisement every
  ``ADVERTISE_EVERY_S``.

No format change in this release: it reads and writes format 6 only (the mechanism is exercised
by the tests with a test-only format 7).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

log = logging.getLogger(__name__)

__all__ = ["StateFormat", "UnreadableValue", "FORMATS", "CURRENT", "PREVIOUS_READS", "select_write",
           "parse_state_format", "FormatSelector", "checkpoint_in", "checkpoint_out", "settings_in", "settings_out",
           "probe_checkpoint", "start_advertising", "ADVERTISE_TTL_S", "ADVERTISE_EVERY_S", "FORMATS_KEY"]

#: the format this release's code works in (what ``*_in`` converts to)
CURRENT = 6
#: the formats the previous release (e8f2be2, which advertises nothing) reads: what this release
#: writes unless ``--state-format`` names another one
PREVIOUS_READS = frozenset({6})
#: an advertisement lives this long without a refresh (seconds); refreshed every ``ADVERTISE_EVERY_S``
ADVERTISE_TTL_S = 30.0
ADVERTISE_EVERY_S = 10.0
#: key (after the store's prefix) of the advertisements: a hash, field = member id, value =
#: ``b"<expiry unix ms> <read formats, comma separated> <written format>"``
FORMATS_KEY = "state-formats"

#: first bytes of a Responses stream state (``worker.core.responses.service``: ``PIECES_MAGIC``
#: as the Kafka worker stores it; ``PACKED_MAGIC`` for a caller that keeps one value)
_RESPONSES_MAGICS = (b"\xc1RSP2", b"\xc1RSP1")
#: the same for a Messages stream state (``worker.core.messages.service``); release e8f2be2 wrote
#: none (it has no Messages kinds: during a roll its workers answer Messages records with errors)
_MESSAGES_MAGICS = (b"\xc1MSG2", b"\xc1MSG1")
#: the state version of each kind in format 6
_KIND_VERSIONS6 = {"chat": 6, "responses": 1, "messages": 1}
_KIND_NAMES = {"chat": "", "responses": "Responses ", "messages": "Messages "}


class UnreadableValue(ValueError):
    """A stored value no format of this release reads; ``str()`` says what was found."""


class _Version(msgspec.Struct, array_like=True):
    v: int


class _Envelope(msgspec.Struct, array_like=True):
    """A checkpoint's envelope as every format so far lays it out: version, state, replay window."""

    v: int
    state: bytes | None
    replies: msgspec.Raw


_version = msgspec.msgpack.Decoder(_Version)
_envelope = msgspec.msgpack.Decoder(_Envelope)


def _head_version(data: bytes) -> int | None:
    """The first item of a msgpack array when it is an int (a state's / settings' version), else None."""
    try:
        return _version.decode(data).v
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _state_versions(state: bytes) -> tuple[str, int | None]:
    """``("chat", v)`` / ``("responses", v)`` / ``("messages", v)`` of a stored state's bytes (v
    None: unreadable)."""
    for kind, magics in (("responses", _RESPONSES_MAGICS), ("messages", _MESSAGES_MAGICS)):
        for magic in magics:
            if state[:len(magic)] == magic:
                return kind, _head_version(state[len(magic):])
    return "chat", _head_version(state)


def _probe6(value: bytes) -> str | None:
    """None when ``value`` is a format-6 checkpoint (envelope 1; chat state 6, Responses or
    Messages state 1, or nil: a tombstone), else why not."""
    v = _head_version(value)
    if v is not None and v != 1:
        return f"checkpoint version {v}"
    try:
        env = _envelope.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return f"not a checkpoint ({e})"
    if env.state is None:
        return None
    kind, v = _state_versions(env.state)
    if v != _KIND_VERSIONS6[kind]:
        return f"{_KIND_NAMES[kind]}state version {v if v is not None else 'unreadable'}"
    return None


def _probe_settings6(value: bytes) -> str | None:
    v = _head_version(value)
    return None if v == 6 else f"settings version {v if v is not None else 'unreadable'}"


def _same(b: bytes) -> bytes:
    return b


@dataclass(frozen=True)
class StateFormat:
    """One stored-state format: ``version``; ``probe_checkpoint`` / ``probe_settings``: None when a
    stored value is of this format, else why not; ``*_in``: its bytes to the ``CURRENT`` layout;
    ``*_out``: ``CURRENT`` bytes to its layout."""

    version: int
    probe_checkpoint: Callable[[bytes], str | None]
    probe_settings: Callable[[bytes], str | None]
    checkpoint_in: Callable[[bytes], bytes] = _same
    checkpoint_out: Callable[[bytes], bytes] = _same
    settings_in: Callable[[bytes], bytes] = _same
    settings_out: Callable[[bytes], bytes] = _same


#: the formats this release reads (version -> format); tests register a next one
FORMATS: dict[int, StateFormat] = {6: StateFormat(6, _probe6, _probe_settings6)}


def probe_checkpoint(value: bytes) -> int:
    """The format of a stored checkpoint value (newest first). Raises ``UnreadableValue`` naming
    what it holds when no format of ``FORMATS`` reads it."""
    whys = []
    for v in sorted(FORMATS, reverse=True):
        why = FORMATS[v].probe_checkpoint(value)
        if why is None:
            return v
        whys.append(why)
    raise UnreadableValue(whys[-1] if whys else "no format")


def checkpoint_in(value: bytes) -> bytes:
    """A stored checkpoint value in the ``CURRENT`` layout. Raises ``UnreadableValue``."""
    fmt = probe_checkpoint(value)
    return value if fmt == CURRENT else FORMATS[fmt].checkpoint_in(value)


def checkpoint_out(value: bytes, fmt: int) -> bytes:
    """``CURRENT`` checkpoint bytes in format ``fmt`` (one of ``FORMATS``)."""
    return value if fmt == CURRENT else FORMATS[fmt].checkpoint_out(value)


def settings_in(value: bytes) -> bytes:
    """Stored settings in the ``CURRENT`` layout; bytes of no known format come back unchanged
    (the core refuses them: the 409 of another version, or the 400 "unreadable")."""
    for v in sorted(FORMATS, reverse=True):
        if FORMATS[v].probe_settings(value) is None:
            return value if v == CURRENT else FORMATS[v].settings_in(value)
    return value


def settings_out(value: bytes, fmt: int) -> bytes:
    """``CURRENT`` settings bytes in format ``fmt``."""
    return value if fmt == CURRENT or not value else FORMATS[fmt].settings_out(value)


def parse_state_format(text: str | None) -> int | None:
    """``--state-format``: ``auto`` (None) or a format this release reads. Raises ``ValueError``."""
    if text is None or text.strip().lower() in ("", "auto"):
        return None
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"--state-format {text!r}: 'auto' or one of {sorted(FORMATS)}") from None
    if v not in FORMATS:
        raise ValueError(f"--state-format {v}: this release reads formats {sorted(FORMATS)}")
    return v


def select_write(requested: int | None, advertised: Iterable[frozenset[int]], reads: Iterable[int] | None = None,
                 previous_reads: frozenset[int] = PREVIOUS_READS) -> int:
    """The format a worker writes: the newest of ``reads`` (default: ``FORMATS``) that every
    ``advertised`` member reads, no newer than ``requested``, and, when ``requested`` is None
    (``auto``), one of ``previous_reads`` (the previous release advertises nothing). When no
    format qualifies (a member reads none of ours): the oldest of ``reads``."""
    own = set(FORMATS if reads is None else reads)
    ok = set(own)
    for r in advertised:
        ok &= r
    ok = {f for f in ok if (f <= requested if requested is not None else f in previous_reads)}
    return max(ok) if ok else min(own)


def _member_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class FormatSelector:
    """One worker's write format (``write``), chosen by ``select_write`` from ``requested``
    (``--state-format``; None: auto) and the live members' advertisements; ``run(store)`` keeps
    this worker's advertisement and the choice fresh (every ``ADVERTISE_EVERY_S``)."""

    requested: int | None = None
    member: str = field(default_factory=_member_id)
    write: int = -1
    #: the live members' read sets seen at the last refresh (this worker's included)
    members: dict[str, frozenset[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.write < 0:
            self.write = select_write(self.requested, ())

    def choose(self, advertised: dict[str, frozenset[int]]) -> int:
        """Set ``write`` from ``advertised`` (member -> read formats); returns it (logs a change)."""
        new = select_write(self.requested, advertised.values())
        if new != self.write:
            log.warning("stream state format: writing format %d (was %d; live members read %s)", new, self.write,
                        sorted({f for r in advertised.values() for f in r}))
        self.members = dict(advertised)
        self.write = new
        return new

    async def refresh(self, store) -> int:
        """Advertise this worker and re-choose from every live advertisement (``store``: a
        ``RedisStateStore``). Raises the store's errors."""
        now_ms = int(time.time() * 1000)
        await store.advertise_formats(self.member, frozenset(FORMATS), self.write,
                                      now_ms + int(ADVERTISE_TTL_S * 1000))
        return self.choose(await store.advertised_formats(now_ms))

    async def run(self, store) -> None:
        """``refresh`` every ``ADVERTISE_EVERY_S`` until cancelled (a failed refresh keeps the last
        choice; logged once per outage); withdraws the advertisement when cancelled."""
        failing = False
        try:
            while True:
                try:
                    await self.refresh(store)
                    failing = False
                except Exception as e:
                    if not failing:
                        log.warning("stream state format: advertisement refresh failed (%s: %s); writing "
                                    "format %d", type(e).__name__, e, self.write)
                    failing = True
                await asyncio.sleep(ADVERTISE_EVERY_S)
        except asyncio.CancelledError:
            try:
                await asyncio.wait_for(store.withdraw_formats(self.member), 1.0)
            except Exception as e:  # its TTL ends it anyway
                log.info("stream state format: withdrawing the advertisement failed: %s", e)
            raise


def start_advertising(store, tasks: set) -> None:
    """Start ``store.formats.run(store)`` (a ``FormatSelector``: Redis stores only; others have
    none) as a task kept in ``tasks`` (the caller cancels it at its close)."""
    sel = getattr(store, "formats", None)
    if isinstance(sel, FormatSelector):
        task = asyncio.create_task(sel.run(store), name="derender-state-formats")
        tasks.add(task)
        task.add_done_callback(tasks.discard)
