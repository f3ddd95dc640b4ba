"""Redis store for streaming derender state (redis-py asyncio).

One hash per streamed request: key ``{prefix}{<request_id>}`` (default prefix
``derender:stream:``; the braces make the request id a Redis Cluster hash tag), fields ``s``
(the state bytes ``DerenderService.derender_stream`` returned: every choice of the request lives
in that one value) and ``q`` (the sequence number of the chunk that produced it).

* Every key has a TTL (``ttl_s``), refreshed on each read and write: an abandoned stream
  disappears on its own; ``delete`` removes it at the end of the stream.
* Writes are fenced with a Lua compare-and-set on the sequence number: a write with ``seq`` <=
  the stored one is refused (a stale worker that lost the partition cannot overwrite a newer
  state). Deletes are fenced the same way (refused when the stored ``q`` is newer).
* ``get_many`` / ``commit`` batch a whole poll's reads / writes into one pipeline (one round
  trip).

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
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.tlsfiles import check_tls_files

_CONN_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "derender:stream:"
DEFAULT_TTL_S = 900.0

# KEYS[1] key; ARGV: state, seq, ttl_ms. 1 = written, 0 = fenced off (stored seq >= seq).
_CAS_PUT = """
local cur = redis.call('HGET', KEYS[1], 'q')
if cur and tonumber(cur) >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'q', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
# KEYS[1] key; ARGV: seq. 1 = deleted (or absent), 0 = fenced off (stored seq > seq).
_CAS_DEL = """
local cur = redis.call('HGET', KEYS[1], 'q')
if cur and tonumber(cur) > tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


#: error replies of a refused AUTH/HELLO or a missing permission (Redis ACL documentation)
_AUTH_REPLIES = ("NOAUTH", "WRONGPASS", "NOPERM")


def _auth_message(e: Exception) -> str:
    """One line for a refused login: what Redis said and the flags that set the credentials."""
    said = " ".join(str(e).split())[:300]
    return (f"redis refused the credentials ({type(e).__name__}: {said}): check --redis-password / "
            f"--redis-username (env DERENDER_REDIS_PASSWORD / DERENDER_REDIS_USERNAME) and the user's ACL")


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
class StateWrite:
    """One write of a ``commit`` batch: ``state`` None deletes the stream's key (end)."""

    request_id: str
    state: bytes | None
    seq: int


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
                   help="redis:// or rediss:// (TLS) URL, db in the path")
    g.add_argument("--redis-password", default=None)
    g.add_argument("--redis-username", default=None)
    g.add_argument("--redis-tls-ca", default=None, help="CA bundle for rediss://")
    g.add_argument("--redis-tls-cert", default=None, help="client certificate")
    g.add_argument("--redis-tls-key", default=None, help="client key")
    g.add_argument("--redis-tls-insecure", action="store_true", default=False)
    g.add_argument("--redis-state-ttl", type=float, default=DEFAULT_TTL_S,
                   help="seconds a stream state survives without use")
    g.add_argument("--redis-key-prefix", default=DEFAULT_PREFIX)
    g.add_argument("--redis-timeout", type=float, default=5.0)


def settings_from_args(args: argparse.Namespace) -> RedisSettings:
    """``RedisSettings`` from parsed ``add_redis_args`` flags. Raises ``ValueError`` naming the
    flag and the file when a ``--redis-tls-*`` file cannot be loaded (``worker.tlsfiles``)."""
    check_tls_files(args.redis_tls_ca, args.redis_tls_cert, args.redis_tls_key,
                    flags=("--redis-tls-ca", "--redis-tls-cert", "--redis-tls-key"))
    return RedisSettings(url=args.redis_url, password=args.redis_password, username=args.redis_username,
                         tls_ca=args.redis_tls_ca, tls_cert=args.redis_tls_cert, tls_key=args.redis_tls_key,
                         tls_insecure=args.redis_tls_insecure, ttl_s=args.redis_state_ttl,
                         prefix=args.redis_key_prefix, timeout_s=args.redis_timeout)


class RedisStateStore:
    """Async store of stream states (module docstring). ``client``: a redis-py asyncio client
    (binary responses); ``ttl_s``: key TTL refreshed on use; ``prefix``: key prefix."""

    def __init__(self, client: aioredis.Redis, *, ttl_s: float = DEFAULT_TTL_S, prefix: str = DEFAULT_PREFIX):
        self.client = client
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.prefix = prefix
        self._put = client.register_script(_CAS_PUT)
        self._del = client.register_script(_CAS_DEL)

    @classmethod
    def from_settings(cls, settings: RedisSettings) -> RedisStateStore:
        """Store over a new client built from ``settings``."""
        return cls(settings.client(), ttl_s=settings.ttl_s, prefix=settings.prefix)

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

    async def get_many(self, request_ids: list[str]) -> dict[str, StoredState | None]:
        """Stored states of several requests in one pipeline (TTLs refreshed).
        Raises ``StoreReadError`` (``StoreConnectError`` when Redis cannot be reached)."""
        rids = list(dict.fromkeys(request_ids))
        if not rids:
            return {}
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for rid in rids:
                    k = self.key(rid)
                    pipe.hmget(k, "s", "q")
                    pipe.pexpire(k, self.ttl_ms)
                res = await pipe.execute()
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis read failed: {type(e).__name__}: {e}") from e
        except RedisError as e:
            raise StoreReadError(f"redis read failed: {type(e).__name__}: {e}") from e
        out: dict[str, StoredState | None] = {}
        for i, rid in enumerate(rids):
            s, q = res[2 * i]
            if s is None and q is None:
                out[rid] = None
                continue
            if s is None or q is None:
                raise StoreReadError(f"malformed stream state hash {self.key(rid)!r}", rid)
            try:
                out[rid] = StoredState(bytes(s), int(q))
            except ValueError:
                raise StoreReadError(f"bad sequence number {q!r} in {self.key(rid)!r}", rid) from None
        return out

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
                await self.client.delete(self.key(request_id))
                return True
            return bool(await self._del(keys=[self.key(request_id)], args=[int(seq)]))
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis delete failed: {type(e).__name__}: {e}", request_id) from e
        except RedisError as e:
            raise StoreDeleteError(f"redis delete failed: {type(e).__name__}: {e}", request_id) from e

    async def commit(self, writes: list[StateWrite]) -> list[bool]:
        """Apply a poll's writes in one pipeline, in order (fenced puts; ``state=None`` ->
        fenced delete). Returns per write True (applied) / False (fenced off: stale).
        Raises ``StoreWriteError`` (``StoreConnectError`` when Redis cannot be reached)."""
        if not writes:
            return []
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for w in writes:
                    k = self.key(w.request_id)
                    if w.state is None:
                        await self._del(keys=[k], args=[int(w.seq)], client=pipe)
                    else:
                        await self._put(keys=[k], args=[w.state, int(w.seq), self.ttl_ms], client=pipe)
                res = await pipe.execute()
        except _CONN_ERRORS as e:
            raise StoreConnectError(f"redis write failed: {type(e).__name__}: {e}") from e
        except RedisError as e:
            raise StoreWriteError(f"redis write failed: {type(e).__name__}: {e}") from e
        return [bool(r) for r in res]
