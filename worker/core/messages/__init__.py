"""Anthropic Messages API derender (issue 26): token ids -> ``/v1/messages`` Messages and stream
events.

Modules, one job each: ``ids`` (deterministic message / tool_use ids, thinking signatures),
``request`` (request checks and the parsers' view of the request), ``events`` (Messages events
from the shared Responses event builder, and the SDK's accumulation of them), ``derender``
(non-streaming Message and one streaming chunk, the stream state), ``service`` (bytes in / bytes
out, Anthropic error objects). ``DerenderService`` (``worker/core/service.py``) wraps them.
"""
