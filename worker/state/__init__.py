"""Stream state stores: where the per-request ``StreamState`` bytes of
``DerenderService.derender_stream`` live between chunks (``redis_store``: Redis, fenced writes)."""
from worker.state.redis_store import (
    RedisSettings,
    RedisStateStore,
    StaleStateError,
    StateStoreError,
    StateWrite,
    StoreConnectError,
    StoreDeleteError,
    StoredState,
    StoreReadError,
    StoreWriteError,
    add_redis_args,
    settings_from_args,
)

__all__ = ["RedisSettings", "RedisStateStore", "StaleStateError", "StateStoreError", "StoreConnectError",
           "StoreDeleteError", "StoredState", "StoreReadError", "StoreWriteError", "StateWrite",
           "add_redis_args", "settings_from_args"]
