"""Topic administration: ``ensure_topics`` creates the topics a command needs where missing.

Used by ``derender-worker demo`` and ``bench kafka`` (fresh topics per run) and by the tests; the
worker itself (``derender-worker run``) never creates topics: an operator creates them (see
docs/kafka.md, "Topics and partitions"), or the broker auto-creates them on first use.
"""
from __future__ import annotations

from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

__all__ = ["ensure_topics"]


async def ensure_topics(bootstrap_servers: str, topics: dict[str, int], **client_kwargs: Any) -> None:
    """Create ``topics`` (name -> partition count, replication factor 1) where missing; existing
    topics are left alone (their partition count is not changed). ``client_kwargs`` go to
    ``AIOKafkaAdminClient`` (security settings). Raises ``KafkaError`` on other broker errors."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **client_kwargs)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(t, n, 1) for t, n in topics.items() if t not in existing]
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass  # created meanwhile by another client or by auto-create: what we wanted
    finally:
        await admin.close()
