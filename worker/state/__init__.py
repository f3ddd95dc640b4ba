"""Stream state stores: where the per-request ``StreamState`` bytes of
``DerenderService.derender_stream`` live between chunks (``redis_store``: Redis, fenced writes;
``memory_store``: this process only)."""
from worker.state.memory_store import MemoryStateStore  # noqa: E402  (after redis_store: it imports it)
from worker.state.redis_store import (
    RedisSettings,
    RedisStateStore,
    StaleStateError,
    StateStoreError,
    StateWrite,
    StoreAuthError,
    StoreConnectError,
    StoreDeleteError,
    StoredState,
    StoreKeyTypeError,
    StoreReadError,
    StoreWriteError,
    UnreadableState,
    add_redis_args,
    settings_from_args,
)

__all__ = ["MemoryStateStore", "RedisSettings", "RedisStateStore", "StaleStateError", "StateStoreError", "StoreAuthError", "StoreConnectError",
           "StoreDeleteError", "StoreKeyTypeError", "StoredState", "StoreReadError", "StoreWriteError", "StateWrite", "UnreadableState",
           "add_redis_args", "settings_from_args"]
