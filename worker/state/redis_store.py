"""Redis store for streaming derender state (redis-py asyncio).

One string per streamed request: key ``{prefix}{<request_id>}`` (default prefix
``derender:stream:``; the braces make the request id a Redis Cluster hash tag), value the
``SEQ_DIGITS`` (20) zero-padded ASCII digits of the sequence number of the chunk that produced
the state, then the state bytes ``DerenderService.derender_stream`` returned (every choice of the
request lives in that one value). Keys of the older layout (a hash, fields ``s``/``q``) are still
read, fenced on their ``q`` and replaced by the first write.

* Every key has a TTL (``ttl_s``), refreshed on each read and write: an abandoned stream
  disappears on its own; ``delete`` removes it at the end of the stream.
* Writes are fenced with a Lua compare-and-set on the sequence number: a write with ``seq`` <=
  the stored one is refused (a stale worker that lost the partition cannot overwrite a newer
  state); a write to an absent key is ``SET ... NX`` (only if still absent). Deletes are fenced
  the same way (refused when the stored seq is newer).
* ``get_many`` batches a whole poll's reads into one pipeline (one ``GETEX`` per key);
  ``commit`` carries a whole flush's writes in one EVALSHA (per ``COMMIT_BATCH_MAX`` writes),
  which runs one ``MGET`` and one command per write: counted as ``INFO commandstats`` counts
  them (the EVALSHA and each ``redis.call``), a flush of n writes costs n + 2 commands, plus a
  ``SETRANGE`` per write carrying piece bytes (and a ``STRLEN`` before it when they do not
  start the pieces: pieces shorter than the offset were lost and stay short, never zero-padded)
  and a ``PEXPIRE`` per write asking for the pieces'
  TTL (``StateWrite.at`` / ``data`` / ``touch``: the stream's append-only pieces,
  ``worker.state.pieces``, key ``{prefix}{<request_id>}:pieces``, written in the same fenced
  step as the checkpoint and deleted with it). ``read_pieces`` reads them (one ``GETRANGE``).
* A chat/completion stream's write-once settings (``StateWrite.settings``:
  ``DerenderService.derender_stream(settings_aside=True)``, issue 13 item 4) live at
  ``{prefix}{<request_id>}:settings``: written (``SET ... PX``) by the fenced write that carries
  them (the stream's first checkpoint) in the same EVALSHA, never rewritten by later ones, their TTL
  a quarter longer than the checkpoint's and refreshed with the write's ``touch``, deleted with the
  checkpoint; ``read_settings`` reads them (``GETEX``). ``commit_codes`` tells a put that landed on
  an absent checkpoint of a stream whose settings are missing (the store lost both: code 2).

Typical transport loop (per polled batch of chunk messages, grouped by request id, in order)::

    store = RedisStateStore.from_settings(settings_from_args(args))   # or RedisStateStore(client)
    await store.ping()                                               # StoreConnectError
    stored = await store.get_many(request_ids)                       # {rid: StoredState | None}
    writes = []
    for msg in batch:                                                # same request: in order
        prev = states.get(rid) or (stored[rid].state if stored[rid] else None)
        res, new_state = service.derender_stream(msg.value, prev, seq=msg.offset)
        publish(res.body)                                            # JSON list of chunks / error
        if new_state is not None:
            states[rid] = new_state
            writes.append(StateWrite(rid, None if res.done else new_state, res.seq))
    results = await store.commit(writes)                             # [True | False(stale)]

``StateWrite(rid, None, seq)`` deletes the key (end of stream). Errors are typed per step:
``StoreConnectError`` (connect/ping), ``StoreReadError`` (get), ``StoreWriteError`` (put/commit),
``StoreDeleteError`` (delete), all ``StateStoreError``; ``StaleStateError`` when ``put(...,
raise_on_stale=True)`` is fenced off.

Configuration (``add_redis_args``; each flag also reads ``DERENDER_<FLAG>``): ``--redis-url``
(``DERENDER_REDIS_URL``, default ``redis://127.0.0.1:6379/0``; ``rediss://`` for TLS),
``--redis-password``, ``--redis-username``, ``--redis-tls-ca``, ``--redis-tls-cert``,
``--redis-tls-key``, ``--redis-tls-insecure`` (no certificate check), ``--redis-state-ttl``
(seconds, default 900), ``--redis-key-prefix``, ``--redis-timeout`` (seconds).
"""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.secretfiles import secret
from worker.state.formats import FORMATS_KEY, FormatSelector, parse_state_format
from worker.tlsfiles import check_tls_files

_CONN_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

log = logging.getLogger(__name__)

#: most state-format advertisements read (``advertised_formats``)
ADVERTISED_MAX = 10_000

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "derender:stream:"
DEFAULT_TTL_S = 900.0

#: digits of the sequence number that starts a stored value (zero-padded: compared as strings,
#: exact for every seq up to ``worker.transport.records.SEQ_MAX``, unlike Lua's double numbers)
SEQ_DIGITS = 20
#: the stream's append-only pieces live at ``key(request_id) + PIECES_SUFFIX`` (``worker.state.pieces``)
PIECES_SUFFIX = ":pieces"
#: a chat/completion stream's write-once settings live at ``key(request_id) + SETTINGS_SUFFIX``
#: (``DerenderService.derender_stream(settings_aside=True)``; issue 13 item 4)
SETTINGS_SUFFIX = ":settings"
#: most writes carried by one EVALSHA (Lua's ``unpack`` of the MGET keys is bounded by its C stack)
COMMIT_BATCH_MAX = 1000

# One flush of fenced writes. KEYS: the keys, one per write (a key may repeat: applied in order).
# ARGV[1] ttl_ms, ARGV[2] the settings' ttl_ms; per write i, from ARGV[8i-5]: 'p' (put) / 'd' (delete), its seq (SEQ_DIGITS
# digits), the stored value (seq digits + state; '' for a delete), the offset of its piece bytes
# in the stream's pieces (``{key}:pieces``, ``worker.state.pieces``; '' when the stream keeps none),
# those bytes, '1' to refresh the side keys' TTL (else ''), the stream's write-once settings
# (``{key}:settings``, written once: its first chunk's write; else ''), and '1' when the stream keeps
# settings there (else '').
# Returns per write 1 = applied, 0 = fenced off (put: stored seq >= seq; delete: stored seq > seq),
# 2 = applied, but the stream's settings are missing (a put over an absent checkpoint, the stream
# keeping settings that this write does not carry: the store lost them; send them again), 3 = not
# applied: the stored key is of another shape (not seq digits + state, nor the older hash with a
# numeric q (a hash without one too): another release's or a foreign value; a Redis type other than string/hash); its seq
# cannot be compared, so it is left to its TTL. Commands on keys of an unexpected type never raise
# (redis.pcall; a pieces key of another type is left unwritten: its reader gets the 409 "lost").
# Redis commands run (``INFO commandstats`` counts each ``redis.call`` as a call of that command,
# besides the one EVALSHA): one MGET for the whole flush, then per write ONE of: SET ... PX (a put
# over a stored value), SET ... PX NX (a put of an absent key: a stream's first write), DEL (a
# delete of a stored value, its pieces and settings with it), TYPE (a delete of an absent key). A put of a
# stream that keeps pieces adds SETRANGE (its bytes, at the offset the previous state recorded:
# a redelivered chunk rewrites, never appends twice) when it has bytes (after a STRLEN when that
# offset is not 0: pieces shorter than it were lost, expired or truncated, and are left short, never
# zero-padded, so a reader gets the "lost or expired" 409, not NUL bytes), and PEXPIRE when the write
# asks for it (``StateWrite.touch``: the pieces' first bytes, then often enough that they outlive
# the checkpoint's TTL: the Kafka worker asks every quarter TTL). A put carrying settings adds a SET
# ... PX of them (the stream's first write; their TTL is a quarter longer than the checkpoint's, so
# that, refreshed every quarter TTL, they outlive it); one of a stream keeping settings adds a
# PEXPIRE of them when it asks for the refresh, and an EXISTS when it lands on an absent checkpoint.
# A key left by the older hash layout
# (fields s/q: MGET reads it as nil) costs HGET + SET/DEL more, and is fenced on its q.
_COMMIT = """
local ttl = ARGV[1]
local sttl = ARGV[2]
local cur = redis.call('MGET', unpack(KEYS))
local seen = {}
local out = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  local b = 8 * i - 5
  local kind, q, v, at, data, touch = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local sv, sx = ARGV[b + 6], ARGV[b + 7]
  local c = seen[k]
  if c == nil then
    c = cur[i]
    if c then c = string.sub(c, 1, SEQ_DIGITS_N) end
  end
  local ok = 0
  if c and not string.find(c, SEQ_PATTERN) then
    ok = 3
  elseif c then
    if kind == 'p' then
      if c < q then redis.call('SET', k, v, 'PX', ttl); ok = 1; seen[k] = q end
    elseif c <= q then redis.call('DEL', k, k .. PIECES_SUFFIX, k .. SETTINGS_SUFFIX); ok = 1; seen[k] = false end
  elseif kind == 'p' then
    if redis.call('SET', k, v, 'PX', ttl, 'NX') then
      ok = 1
    else
      local h = redis.pcall('HGET', k, 'q')
      if type(h) == 'table' or not tonumber(h) then
        ok = 3
      elseif tonumber(h) < tonumber(q) then redis.call('SET', k, v, 'PX', ttl); ok = 1 end
    end
    if ok == 1 then seen[k] = q end
  else
    if redis.call('TYPE', k)['ok'] == 'none' then
      ok = 1
    else
      local h = redis.pcall('HGET', k, 'q')
      if type(h) == 'table' or not tonumber(h) then
        ok = 3
      elseif tonumber(h) <= tonumber(q) then
        redis.call('DEL', k, k .. PIECES_SUFFIX, k .. SETTINGS_SUFFIX); ok = 1; seen[k] = false
      end
    end
  end
  if ok == 1 and kind == 'p' and at ~= '' then
    local pk = k .. PIECES_SUFFIX
    local o = tonumber(at)
    if string.len(data) > 0 then
      local n = 0
      if o ~= 0 then n = redis.pcall('STRLEN', pk) end
      if type(n) == 'number' and n >= o then redis.pcall('SETRANGE', pk, o, data) end
    end
    if touch == '1' then redis.call('PEXPIRE', pk, ttl) end
  end
  if ok == 1 and kind == 'p' then
    local sk = k .. SETTINGS_SUFFIX
    if sv ~= '' then
      redis.call('SET', sk, sv, 'PX', sttl)
    elseif sx == '1' then
      if not c and redis.call('EXISTS', sk) == 0 then
        ok = 2
      elseif touch == '1' then
        redis.call('PEXPIRE', sk, sttl)
      end
    end
  end
  out[i] = ok
end
return out
""".replace("SEQ_PATTERN", "'^" + "%d" * SEQ_DIGITS + "$'").replace("SEQ_DIGITS_N", str(SEQ_DIGITS)).replace("PIECES_SUFFIX", f"'{PIECES_SUFFIX}'").replace(
    "SETTINGS_SUFFIX", f"'{SETTINGS_SUFFIX}'")


def seq_digits(seq: int) -> bytes:
    """``seq`` as the ``SEQ_DIGITS`` ASCII digits that start a stored value. Raises
    ``ValueError`` for a negative seq or one with more digits."""
    if seq < 0 or seq >= 10 ** SEQ_DIGITS:
        raise ValueError(f"sequence number {seq} out of range")
    return b"%020d" % seq


def stored_value(state: bytes, seq: int) -> bytes:
    """The stored string of a stream: ``seq_digits(seq)`` then the state bytes."""
    return seq_digits(seq) + state


#: error replies of a refused AUTH/HELLO or a missing permission (Redis ACL documentation)
_AUTH_REPLIES = ("NOAUTH", "WRONGPASS", "NOPERM")


def _auth_message(e: Exception) -> str:
    """One line for a refused login: what Redis said and the flags that set the credentials."""
    said = " ".join(str(e).split())[:300]
    return (f"redis refused the credentials ({type(e).__name__}: {said}): check --redis-password / "
            f"--redis-password-file / --redis-username (env DERENDER_REDIS_PASSWORD / DERENDER_REDIS_PASSWORD_FILE / "
            f"DERENDER_REDIS_USERNAME) and the user's ACL")


class StateStoreError(Exception):
    """A state store operation failed; ``step`` names it (connect/read/write/delete)."""

    step = "store"

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


class StoreConnectError(StateStoreError):
    """Redis cannot be reached (connect, auth, TLS, ping)."""

    step = "connect"


class StoreAuthError(StateStoreError, ValueError):
    """Redis refused this client's credentials or permissions (``AUTH``/``HELLO`` failed:
    ``WRONGPASS``, ``NOAUTH``, ``NOPERM``): a configuration error, not an outage; waiting for it
    to pass would only hide it. A ``ValueError`` too, so startup reports it as bad configuration."""

    step = "connect"


class StoreReadError(StateStoreError):
    """Reading a state failed (or the stored hash is malformed)."""

    step = "read"


class StoreKeyTypeError(StoreReadError):
    """A stream's key holds another Redis type than the one read (``WRONGTYPE``: another
    release's or a foreign value): that stream cannot go on, the store works."""


def _read_error(e: Exception, request_id: str) -> StoreReadError:
    """The typed error of a failed read of ``request_id``'s side key (``WRONGTYPE``:
    ``StoreKeyTypeError``)."""
    cls = StoreKeyTypeError if isinstance(e, ResponseError) and str(e).startswith("WRONGTYPE") else StoreReadError
    return cls(f"redis read failed: {type(e).__name__}: {e}", request_id)


class StoreWriteError(StateStoreError):
    """Writing states failed."""

    step = "write"


class StoreDeleteError(StateStoreError):
    """Deleting a state failed."""

    step = "delete"


class StaleStateError(StateStoreError):
    """A fenced write was refused: the stored state has a newer (or equal) sequence number."""

    step = "fence"


@dataclass(frozen=True)
class StoredState:
    """A stored state: the bytes and the sequence number that wrote them."""

    state: bytes
    seq: int


@dataclass(frozen=True)
class UnreadableState:
    """A stored key this release cannot read (``get_many``): another Redis type than a string or
    the older hash layout, or a string that does not start with the seq digits (another
    release's or a foreign value). ``reason``: what was found (for the stream's 409)."""

    reason: str


@dataclass(frozen=True)
class StateWrite:
    """One write of a ``commit`` batch: ``state`` None deletes the stream's key (end) and its
    pieces. ``at`` / ``data``: the chunk's piece bytes, written at offset ``at`` (the pieces'
    length the previous state recorded) in the same fenced write (``at`` -1: the stream keeps
    no pieces)."""

    request_id: str
    state: bytes | None
    seq: int
    at: int = -1
    data: bytes = b""
    #: refresh the side keys' TTL (pieces: to the checkpoint's; settings: a quarter more) (the
    #: pieces' first write, and at least every quarter TTL: the checkpoint's own TTL is refreshed
    #: by every write)
    touch: bool = False
    #: the stream's write-once settings, written with this checkpoint (its first write; ``b""``:
    #: none carried)
    settings: bytes = b""
    #: the stream keeps write-once settings in the store (a put landing on an absent checkpoint
    #: without them then reports them missing: ``commit_codes`` 2)
    settings_kept: bool = False


@dataclass
class RedisSettings:
    """Connection settings (see module docstring for the flags)."""

    url: str = DEFAULT_URL
    password: str | None = None
    username: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_insecure: bool = False
    ttl_s: float = DEFAULT_TTL_S
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = 5.0
    #: ``--state-format``: the stored-state format to write (None: auto; ``worker.state.formats``)
    state_format: int | None = None

    def client(self) -> aioredis.Redis:
        """A redis-py asyncio client for these settings (binary responses)."""
        kw: dict = {"socket_timeout": self.timeout_s, "socket_connect_timeout": self.timeout_s,
                    "decode_responses": False}
        if self.password is not None:
            kw["password"] = self.password
        if self.username is not None:
            kw["username"] = self.username
        tls = self.url.startswith("rediss://")
        if tls:
            if self.tls_ca:
                kw["ssl_ca_certs"] = self.tls_ca
            if self.tls_cert:
                kw["ssl_certfile"] = self.tls_cert
            if self.tls_key:
                kw["ssl_keyfile"] = self.tls_key
            if self.tls_insecure:
                kw["ssl_cert_reqs"] = "none"
                kw["ssl_check_hostname"] = False
        elif self.tls_ca or self.tls_cert or self.tls_key:
            raise ValueError("TLS options need a rediss:// URL")
        return aioredis.Redis.from_url(self.url, **kw)


def add_redis_args(ap: argparse.ArgumentParser) -> None:
    """Add the ``--redis-*`` flags (env ``DERENDER_REDIS_*`` through ``worker.flags.apply_env``)."""
    g = ap.add_argument_group("stream state store (Redis)")
    g.add_argument("--redis-url", default=DEFAULT_URL,
                   help="redis:// or rediss:// (TLS) URL, db in the path (a password in it is visible to every "
                        "user of this host: give it with --redis-password-file)")
    g.add_argument("--redis-password", default=None,
                   help="visible to every user of this host (ps, /proc/PID/cmdline): prefer --redis-password-file "
                        "or the env DERENDER_REDIS_PASSWORD, which are not")
    g.add_argument("--redis-password-file", default=None, metavar="PATH",
                   help="file holding the Redis password (one trailing line break ignored), e.g. a mounted "
                        "Kubernetes Secret; read once at start")
    g.add_argument("--redis-username", default=None)
    g.add_argument("--redis-tls-ca", default=None, help="CA bundle for rediss://")
    g.add_argument("--redis-tls-cert", default=None, help="client certificate")
    g.add_argument("--redis-tls-key", default=None, help="client key")
    g.add_argument("--redis-tls-insecure", action="store_true", default=False)
    g.add_argument("--redis-state-ttl", type=float, default=DEFAULT_TTL_S,
                   help="seconds a stream state survives without use")
    g.add_argument("--redis-key-prefix", default=DEFAULT_PREFIX)
    g.add_argument("--redis-timeout", type=float, default=5.0)
    g.add_argument("--state-format", default="auto",
                   help="stream state format to write: 'auto' (the newest one every live worker reads, and "
                        "the previous release reads) or a format number, for the second roll of an upgrade "
                        "(docs/delivery.md, 'Rolling upgrades across releases')")


def settings_from_args(args: argparse.Namespace) -> RedisSettings:
    """``RedisSettings`` from parsed ``add_redis_args`` flags. Raises ``ValueError`` naming the
    flag and the file when a ``--redis-tls-*`` file cannot be loaded (``worker.tlsfiles``) or
    ``--redis-password-file`` cannot be read (``worker.secretfiles``)."""
    check_tls_files(args.redis_tls_ca, args.redis_tls_cert, args.redis_tls_key,
                    flags=("--redis-tls-ca", "--redis-tls-cert", "--redis-tls-key"))
    password = secret("--redis-password", args.redis_password, getattr(args, "redis_password_file", None))
    return RedisSettings(url=args.redis_url, password=password, username=args.redis_username,
                         tls_ca=args.redis_tls_ca, tls_cert=args.redis_tls_cert, tls_key=args.redis_tls_key,
                         tls_insecure=args.redis_tls_insecure, ttl_s=args.redis_state_ttl,
                         prefix=args.redis_key_prefix, timeout_s=args.redis_timeout,
                         state_format=parse_state_format(getattr(args, "state_format", None)))


class RedisStateStore:
    """Async store of stream states (module docstring). ``client``: a redis-py asyncio client
    (binary responses); ``ttl_s``: key TTL refreshed on use; ``prefix``: key prefix."""

    def __init__(self, client: aioredis.Redis, *, ttl_s: float = DEFAULT_TTL_S, prefix: str = DEFAULT_PREFIX,
                 state_format: int | None = None):
        self.client = client
        #: the format this worker writes (``worker.state.formats``; ``formats.run(store)`` keeps it fresh)
        self.formats = FormatSelector(state_format)
        self.ttl_ms = max(1, int(ttl_s * 1000))
        #: the settings' TTL: a quarter more than the checkpoint's (refreshed every quarter TTL,
        #: they outlive it)
        self.settings_ttl_ms = self.ttl_ms + self.ttl_ms // 4
        self.prefix = prefix
        self._commit = client.register_script(_COMMIT)

    @classmethod
    def from_settings(cls, settings: RedisSettings) -> RedisStateStore:
        """Store over a new client built from ``settings``."""
        return cls(settings.client(), ttl_s=settings.ttl_s, prefix=settings.prefix,
                   state_format=settings.state_format)

    def key(self, request_id: str) -> str:
        """Redis key of a request's stream state."""
        return f"{self.prefix}{{{request_id}}}"

    async def ping(self) -> None:
        """Check the connection. Raises ``StoreAuthError`` when Redis refuses the credentials or
        the user's permissions (at once: no retry fixes it), ``StoreConnectError`` otherwise."""
        try:
            await self.client.ping()
        except (AuthenticationError, NoPermissionError) as e:
            raise StoreAuthError(_auth_message(e)) from e
        except ResponseError as e:
            if str(e).startswith(_AUTH_REPLIES):
                raise StoreAuthError(_auth_message(e)) from e
            raise StoreConnectError(f"redis ping failed: {type(e).__name__}: {e}") from e
        except (RedisError, OSError) as e:
            raise StoreConnectError(f"redis ping failed: {type(e).__name__}: {e}") from e

    async def close(self) -> None:
        """Close the client's connections."""
        await self.client.aclose()

    # -------------------------------------------------------------------------- reads ---
    async def get(self, request_id: str) -> StoredState | None:
        """The stored state of ``request_id`` (TTL refreshed), or None. Raises ``StoreReadError``."""
        return (await self.get_many([request_id]))[request_id]

    async def get_many(self, request_ids: list[str]) -> dict[str, StoredState | UnreadableState | None]:
        """Stored states of several requests in one pipeline: one ``GETEX ... PX`` per request
        (read and TTL refresh in one command; a key of the older hash layout costs ``HMGET`` +
        ``PEXPIRE`` + ``TYPE`` more). A key of another shape (another Redis type, no seq digits,
        a hash without ``s``/``q``) is that request's ``UnreadableState``, never an error of the
        batch. Raises ``StoreReadError`` (``StoreConnectError`` when Redis cannot be reached)."""
        rids = list(dict.fromkeys(request_ids))
        if not rids:
            return {}
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for rid in rids:
                    pipe.getex(self.key(rid), px=self.ttl_ms)
                res = await pipe.execute(raise_on_error=False)
            legacy = [rid for rid, r in zip(rids, res, strict=True)
                      if isinstance(r, ResponseError) and str(r).startswith("WRONGTYPE")]
            old = await self._get_legacy(legacy) if legacy else {}
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis read failed: {type(e).__name__}: {e}") from e
        except RedisError as e:
            raise StoreReadError(f"redis read failed: {type(e).__name__}: {e}") from e
        out: dict[str, StoredState | UnreadableState | None] = {}
        for rid, v in zip(rids, res, strict=True):
            if rid in old:
                out[rid] = old[rid]
                continue
            if isinstance(v, Exception):
                raise StoreReadError(f"redis read of {self.key(rid)!r} failed: {type(v).__name__}: {v}", rid)
            if v is None:
                out[rid] = None
                continue
            head = bytes(v[:SEQ_DIGITS])
            if len(head) != SEQ_DIGITS or not head.isdigit():
                out[rid] = UnreadableState(f"a string value that does not start with {SEQ_DIGITS} seq digits "
                                           f"(first bytes {bytes(v[:12])!r})")
                continue
            out[rid] = StoredState(bytes(v[SEQ_DIGITS:]), int(head))
        return out

    async def read_pieces(self, request_id: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a stream's pieces (``b""`` for an empty range; one
        ``GETRANGE``). Raises ``StoreReadError`` when fewer bytes are stored (the pieces were
        lost: the stream cannot go on), ``StoreConnectError`` when Redis cannot be reached."""
        if end <= start:
            return b""
        try:
            got = bytes(await self.client.getrange(self.key(request_id) + PIECES_SUFFIX, start, end - 1))
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis read failed: {type(e).__name__}: {e}", request_id) from e
        except RedisError as e:
            raise _read_error(e, request_id) from e
        if len(got) != end - start:
            raise StoreReadError(f"pieces of {request_id!r} hold {start + len(got)} bytes, the checkpoint "
                                 f"records {end}", request_id)
        return got

    async def read_settings(self, request_id: str) -> bytes | None:
        """A stream's write-once settings (``GETEX ... PX``: their TTL refreshed), or None when
        none are stored. Raises ``StoreReadError`` (``StoreConnectError`` when Redis cannot be
        reached)."""
        try:
            got = await self.client.getex(self.key(request_id) + SETTINGS_SUFFIX, px=self.settings_ttl_ms)
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis read failed: {type(e).__name__}: {e}", request_id) from e
        except RedisError as e:
            raise _read_error(e, request_id) from e
        return bytes(got) if got is not None else None

    async def _get_legacy(self, rids: list[str]) -> dict[str, StoredState | UnreadableState | None]:
        """Read keys of the older hash layout (fields ``s``/``q``; TTLs refreshed); a key of
        another type, or a hash without them, is an ``UnreadableState``. Raises ``redis`` errors
        other than a key's ``WRONGTYPE``."""
        async with self.client.pipeline(transaction=False) as pipe:
            for rid in rids:
                pipe.hmget(self.key(rid), "s", "q")
                pipe.pexpire(self.key(rid), self.ttl_ms)
                pipe.type(self.key(rid))
            res = await pipe.execute(raise_on_error=False)
        out: dict[str, StoredState | UnreadableState | None] = {}
        for i, rid in enumerate(rids):
            got, typ = res[3 * i], res[3 * i + 2]
            typ = typ.decode("ascii", "replace") if isinstance(typ, bytes) else str(typ)
            if isinstance(got, ResponseError) and str(got).startswith("WRONGTYPE"):
                out[rid] = UnreadableState(f"a Redis {typ} where a string is expected")
                continue
            if isinstance(got, Exception):
                raise got
            if typ == "none":  # (deleted between the two reads)
                out[rid] = None
                continue
            s, q = got
            try:
                if s is None or q is None:
                    raise ValueError("no s/q fields")
                out[rid] = StoredState(bytes(s), int(q))
            except ValueError:
                out[rid] = UnreadableState(f"a Redis hash without a readable s/q pair (q {q!r:.40})")
        return out

    # ------------------------------------------------------------ format advertisements ---
    def formats_key(self) -> str:
        """Redis key of the workers' state-format advertisements (``worker.state.formats``)."""
        return self.prefix + FORMATS_KEY

    async def advertise_formats(self, member: str, reads: frozenset[int], write: int, expires_ms: int) -> None:
        """Advertise that ``member`` reads ``reads`` and writes ``write`` until ``expires_ms``
        (Unix ms): one ``HSET`` + ``PEXPIRE`` of ``formats_key``. Raises ``redis`` errors."""
        k = self.formats_key()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(k, member, f"{expires_ms} {','.join(map(str, sorted(reads)))} {write}")
            pipe.pexpire(k, 2 * max(0, expires_ms - int(time.time() * 1000)) + 1000)
            await pipe.execute()

    async def advertised_formats(self, now_ms: int) -> dict[str, frozenset[int]]:
        """The live advertisements (member -> read formats; at most ``ADVERTISED_MAX`` members,
        each at most 64 formats), read by ``HSCAN`` up to that bound (a hash of millions of
        fields is never read whole); expired ones are removed (``HDEL``), malformed ones ignored.
        Raises ``redis`` errors (a ``formats_key`` of another type: ``WRONGTYPE``)."""
        k = self.formats_key()
        got: dict = {}
        cursor = None
        while cursor != 0 and len(got) < ADVERTISED_MAX:
            cursor, part = await self.client.hscan(k, cursor or 0, count=min(1000, ADVERTISED_MAX))
            got.update(part)
        out: dict[str, frozenset[int]] = {}
        stale = []
        for m, v in list(got.items())[:ADVERTISED_MAX]:
            try:
                exp, reads, _ = bytes(v).decode("ascii").split(" ")
                fmts = frozenset(int(x) for x in reads.split(",")[:64])
                if int(exp) < now_ms:
                    stale.append(m)
                elif all(0 <= f < 1 << 31 for f in fmts):
                    out[bytes(m).decode("utf-8", "replace")] = fmts
            except ValueError:
                log.warning("ignoring a malformed state-format advertisement %r: %r", m[:80], v[:80])
        if stale:
            await self.client.hdel(k, *stale)
        return out

    async def withdraw_formats(self, member: str) -> None:
        """Remove ``member``'s advertisement (a worker stopping). Raises ``redis`` errors."""
        await self.client.hdel(self.formats_key(), member)

    # ------------------------------------------------------------------------- writes ---
    async def put(self, request_id: str, state: bytes, seq: int, *, raise_on_stale: bool = False) -> bool:
        """Fenced write of one state; False (or ``StaleStateError``) when a newer seq is stored.
        Raises ``StoreWriteError``."""
        ok = (await self.commit([StateWrite(request_id, state, seq)]))[0]
        if not ok and raise_on_stale:
            raise StaleStateError(f"stale write for {request_id!r} at seq {seq}", request_id)
        return ok

    async def delete(self, request_id: str, seq: int | None = None) -> bool:
        """Delete a stream's state (end of stream); with ``seq``, fenced (False when a newer
        state is stored). Raises ``StoreDeleteError``."""
        try:
            if seq is None:
                k = self.key(request_id)
                await self.client.delete(k, k + PIECES_SUFFIX, k + SETTINGS_SUFFIX)
                return True
            return bool((await self._flush([StateWrite(request_id, None, seq)]))[0])
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis delete failed: {type(e).__name__}: {e}", request_id) from e
        except RedisError as e:
            raise StoreDeleteError(f"redis delete failed: {type(e).__name__}: {e}", request_id) from e

    async def _flush(self, writes: list[StateWrite]) -> list[int]:
        """Run ``writes`` in order: one EVALSHA (``_COMMIT``) per ``COMMIT_BATCH_MAX`` of them,
        one after the other (not a pipeline: redis-py sends ``SCRIPT EXISTS`` before every
        pipeline holding a script; a plain call loads the script only on ``NOSCRIPT``). Returns
        ``commit_codes``'s codes. Raises ``redis`` errors."""
        out: list[int] = []
        for i in range(0, len(writes), COMMIT_BATCH_MAX):
            part = writes[i:i + COMMIT_BATCH_MAX]
            args: list = [self.ttl_ms, self.settings_ttl_ms]
            for w in part:
                q = seq_digits(int(w.seq))
                if w.state is None:
                    args += (b"d", q, b"", b"", b"", b"", b"", b"")
                else:
                    args += (b"p", q, q + w.state, b"" if w.at < 0 else str(int(w.at)).encode(), w.data,
                             b"1" if w.touch else b"", w.settings, b"1" if w.settings_kept else b"")
            res = await self._commit(keys=[self.key(w.request_id) for w in part], args=args)
            out += [int(r) for r in res]
        return out

    async def commit(self, writes: list[StateWrite]) -> list[bool]:
        """Apply a flush's writes in order, fenced on seq (``state=None`` -> fenced delete), in
        one EVALSHA per ``COMMIT_BATCH_MAX`` writes (one round trip each); Redis runs one MGET per
        EVALSHA and one command per write (``_COMMIT``). Returns per write True (applied) / False
        (fenced off: stale). Raises ``StoreWriteError`` (``StoreConnectError`` when Redis cannot
        be reached); ``ValueError`` for a negative seq."""
        return [c != 0 for c in await self.commit_codes(writes)]

    async def commit_codes(self, writes: list[StateWrite]) -> list[int]:
        """``commit`` with the Lua's code per write: 1 applied, 0 fenced off, 2 applied but the
        stream's settings are missing from the store (a put with ``settings_kept`` and no
        ``settings`` landed on an absent checkpoint: the store lost them; the caller sends them
        with its next write). Raises as ``commit``."""
        if not writes:
            return []
        try:
            return await self._flush(writes)
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis write failed: {type(e).__name__}: {e}") from e
        except RedisError as e:
            raise StoreWriteError(f"redis write failed: {type(e).__name__}: {e}") from e
