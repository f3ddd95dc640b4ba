"""Deterministic Messages ids: the same request id and block index always give the same ids, so
a redelivered record yields byte-identical output (issue 26).

* message ``id``: ``msg_`` + 24 hex of blake2b(request id) (Anthropic's ``msg_...`` shape);
* tool_use ``id``: ``toolu_`` + 24 hex of blake2b(request id, block index), except under a tool
  parser whose ids are 9 alphanumerics (``alnum9``: Mistral, whose chat template accepts only
  such ids back in a request's history): the parser's own id for that call;
* thinking ``signature``: 32 hex of blake2b(request id, block index) (opaque, never empty; a
  derender has no real signature, as vLLM's ``uuid4().hex``).
"""
from __future__ import annotations

import hashlib

__all__ = ["message_id", "tool_use_id", "signature"]


def _hex(*parts: object, size: int = 12) -> str:
    return hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=size).hexdigest()


def message_id(request_id: str) -> str:
    """The Message ``id`` for ``request_id``."""
    return "msg_" + _hex("msg", request_id)


def tool_use_id(request_id: str, index: int, parser_id: str, fmt: str) -> str:
    """The ``id`` of the tool_use block at content ``index`` whose call the tool parser named
    ``parser_id`` (``worker.parsers.stack.tool_call_id``), under the parser's id format ``fmt``."""
    if fmt == "alnum9":
        return parser_id
    return "toolu_" + _hex("toolu", request_id, index)


def signature(request_id: str, index: int) -> str:
    """The ``signature`` of the thinking block at content ``index``."""
    return _hex("sig", request_id, index, size=16)
