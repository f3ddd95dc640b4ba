"""Deterministic Responses ids: the same request id and output index always give the same
item id, so a redelivered record yields byte-identical output (issue 14).

* response ``id``: the engine's ``request_id`` (as chat's ``id``; vLLM's Responses engine request
  id is the response id);
* item ``id``: ``<prefix>_<24 hex>`` with prefix ``msg`` / ``rs`` / ``fc`` (OpenAI's shapes),
  the hex being ``blake2b(request_id, output_index)``;
* ``call_id``: the parser's tool call id (``worker.parsers.stack.tool_call_id``, choice 0, the
  call's number among the response's calls), so its format class is the tool parser's
  (``chatcmpl-tool-...``, or 9 alphanumerics for mistral).
"""
from __future__ import annotations

import hashlib

from worker.parsers.stack import tool_call_id

__all__ = ["ITEM_PREFIX", "item_id", "call_id"]

#: item type -> id prefix (OpenAI: ``msg_...``, ``rs_...``, ``fc_...``)
ITEM_PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc"}


def item_id(request_id: str, output_index: int, item_type: str) -> str:
    """Id of output item ``output_index`` (type ``message``/``reasoning``/``function_call``) of
    the response for ``request_id``. Raises ``KeyError`` for another type."""
    digest = hashlib.blake2b(f"{request_id}\x1f{output_index}".encode(), digest_size=12).hexdigest()
    return f"{ITEM_PREFIX[item_type]}_{digest}"


def call_id(request_id: str, call_number: int, fmt: str) -> str:
    """``call_id`` of the response's ``call_number``-th function call (0-based), in the tool
    parser's id format ``fmt``."""
    return tool_call_id(request_id, 0, call_number, fmt)
