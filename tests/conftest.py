"""Shared fixtures: a Kafka-protocol broker for ``@pytest.mark.kafka`` tests and the Qwen3 models.

``kafka_bootstrap`` (session): ``KAFKA_BOOTSTRAP_SERVERS`` when set, else a testcontainers Kafka
when a Docker engine answers, else an embedded Tansu broker (``worker.transport.broker``).
``kafka_broker_kind``: ``"env"``, ``"testcontainers"`` or ``"tansu"``.
``qwen3_models``: ``load_config_file('tests/data/models.json')`` (relative tokenizer paths are
resolved against that file); ``DERENDER_TEST_MODELS`` may name another config file.
``redis_prefix``: a unique key prefix on the live Redis ``REDIS_URL`` (skips when none answers).
"""
from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import hypothesis  # noqa: F401 - imported at collection: hypothesis' pytest plugin imports it in the
import pytest  # terminal summary otherwise, under assertion rewriting, where CPython 3.11.7's

# "AST constructor recursion depth mismatch" (a finalizer, e.g. an asyncio Future's, running
# during ast.parse) ends the run with a traceback and exit status 1 after every test passed
from tests.harness.kafka import REDIS_URL
from worker.config import load_config_file
from worker.state import RedisSettings, RedisStateStore, StoreConnectError

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def _kafka_broker():
    from worker.transport.broker import bootstrap_for_tests
    try:
        cm = bootstrap_for_tests(with_kind=True)
        bs, kind = cm.__enter__()
    except (FileNotFoundError, RuntimeError, TimeoutError) as e:
        pytest.skip(f"no Kafka-protocol broker available: {e}")
    try:
        yield bs, kind
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def kafka_bootstrap(_kafka_broker) -> str:
    """``host:port`` of a Kafka-protocol broker shared by the session (tests use unique topics)."""
    return _kafka_broker[0]


@pytest.fixture(scope="session")
def kafka_broker_kind(_kafka_broker) -> str:
    return _kafka_broker[1]


@pytest.fixture(scope="session")
def qwen3_models():
    """Served models of ``tests/data/models.json`` (list of ``ServedModelConfig``)."""
    path = os.environ.get("DERENDER_TEST_MODELS") or TESTS_DIR / "data" / "models.json"
    if not Path(path).is_file():
        pytest.skip(f"model config {path} missing")
    return load_config_file(path)


@pytest.fixture
def redis_prefix():
    """A unique key prefix on a live Redis (skips when none answers); keys removed afterwards."""
    prefix = f"derender:test:{uuid.uuid4().hex[:10]}:"

    async def ping():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=prefix, timeout_s=2.0))
        try:
            await store.ping()
        finally:
            await store.close()

    try:
        asyncio.run(ping())
    except StoreConnectError as e:
        pytest.skip(f"no Redis answers at {REDIS_URL}: {e}")
    yield prefix

    async def cleanup():
        store = RedisStateStore.from_settings(RedisSettings(url=REDIS_URL, prefix=prefix))
        keys = [k async for k in store.client.scan_iter(match=prefix + "*")]
        if keys:
            await store.client.delete(*keys)
        await store.close()

    asyncio.run(cleanup())
