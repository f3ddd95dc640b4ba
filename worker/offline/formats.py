"""Input and output formats of batch mode: plain derender JSONL, OpenAI Batch JSONL, Parquet.

Readers yield ``(item, custom_id)`` per input record, in input order. ``item`` is the record's
derender body as JSON bytes (or a JSON array of one request's stream-chunk bodies), or, for a
record that cannot become a body (e.g. an OpenAI Batch line without ``body``), an already-made
result ``(error_body, status)``. ``custom_id`` is the OpenAI Batch ``custom_id`` (None elsewhere).

Writers take one ``(body, status, custom_id)`` result per record, in input order, and write it
to a binary file object handed to them (the commit layer, ``worker.offline.commit``, decides
where that is and renames it into place).

Formats (names accepted by ``--input-format`` / ``--output-format``):

- ``jsonl``: one derender body per line in, one OpenAI response or error object per line out.
- ``openai-batch``: the OpenAI Batch API file format. Input line: ``{"custom_id": ..., "method":
  "POST", "url": ..., "body": <derender body>}``; output line (OpenAI's ``BatchRequestOutput``):
  ``{"id": "batch_req_<line index>", "custom_id": ..., "response": {"status_code": ...,
  "request_id": <response id>, "body": <response or error object>}, "error": null | {"code":
  ..., "message": ...}}``. As in OpenAI's error file, a refused request keeps its HTTP status
  and error body under ``response`` and repeats the error's code and message in ``error``.
- ``parquet``: one row per request. Input columns are the derender body's fields under vLLM's
  names (``model``, ``generate_response``, ``prompt_tokens``, ``prompt_token_ids``,
  ``chat_request``; ``generate_responses``, ``completion_request`` for completions;
  ``generate_chunk`` for a stream chunk); an object field may be a struct column or a JSON
  string column. Null struct members are treated as absent (Parquet cannot tell the two apart;
  keep a field as a JSON string column to send an explicit null). Output columns: see
  ``PARQUET_OUTPUT_SCHEMA``.

Format detection (``detect_input_format``/``output_format_for``): ``.parquet``/``.pq`` names are
Parquet; other input is OpenAI Batch when its first non-blank line is a JSON object with
``custom_id`` and ``body``, plain JSONL otherwise; other output is JSONL, or OpenAI Batch when the
input was.
"""
from __future__ import annotations

import gzip
import io
import os
import select
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import msgspec

from worker.core.service import error_body

INPUT_FORMATS = ("jsonl", "openai-batch", "parquet")
OUTPUT_FORMATS = ("jsonl", "openai-batch", "parquet")

#: derender body fields that hold JSON objects (a Parquet string column of them is parsed)
OBJECT_FIELDS = ("generate_response", "generate_responses", "chat_request", "completion_request",
                 "generate_chunk", "stream_state", "responses_request", "messages_request")
#: body fields a Parquet string column of which is parsed as JSON: every field but ``model``
#: (``schemas/Derender*Request.schema.json``: none of these is ever a string), so a file can hold
#: chat and completion bodies, whose ``prompt_tokens``/``prompt_token_ids`` differ in type (int
#: and list of ids vs list of ints and list of lists), by writing them as JSON strings
JSON_STRING_FIELDS = OBJECT_FIELDS + ("prompt_tokens", "prompt_token_ids", "stream")

#: bytes of the input inspected to tell OpenAI Batch from plain JSONL
SNIFF_BYTES = 1 << 20

def is_parquet_name(path: str) -> bool:
    """True for ``*.parquet`` / ``*.pq`` names (any case)."""
    return path.lower().endswith((".parquet", ".pq"))


#: the first two bytes of every gzip member (RFC 1952, section 2.3.1: ID1 ID2)
GZIP_MAGIC = b"\x1f\x8b"


class AbortableFd(io.RawIOBase):
    """A readable raw stream over file descriptor ``fd`` (not closed with it) whose reads wait in
    ``poll`` on ``fd`` and on ``abort_fd`` together: once ``abort_fd`` is readable (a byte written to
    the other end of a pipe), a read returns end of input at once, even when a pipe's writer keeps
    ``fd`` open without writing. A signal interrupts the wait as it does ``read``."""

    def __init__(self, fd: int, abort_fd: int):
        super().__init__()
        self._fd, self._abort_fd = fd, abort_fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._poll.register(abort_fd, select.POLLIN)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while True:
            ready = {fd for fd, _ in self._poll.poll()}
            if self._abort_fd in ready:
                return 0
            try:
                return os.readv(self._fd, [b])
            except BlockingIOError:  # a descriptor shared non-blocking, drained by another reader
                continue


def _stdin(abort_fd: int | None) -> IO[bytes]:
    """Standard input's bytes: read from descriptor 0 through ``AbortableFd`` when ``abort_fd`` is
    given and ``sys.stdin`` is the process's (else ``sys.stdin.buffer``, e.g. replaced by a test)."""
    stdin = sys.stdin.buffer
    if abort_fd is None:
        return stdin
    try:
        fd = stdin.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return stdin
    return io.BufferedReader(AbortableFd(fd, abort_fd), 1 << 16)


def open_input(path: str, abort_fd: int | None = None) -> tuple[IO[bytes], IO[bytes] | None]:
    """(reader, raw file) of a JSONL input: gzip-decoded when it starts with the gzip magic bytes
    (RFC 1952), whatever its name (so ``-`` fed by ``cat log.jsonl.gz`` works too; a ``.gz`` file
    that is not gzip is refused by ``gzip`` with ``BadGzipFile``, an ``OSError``); ``-`` is
    standard input, which reads as ended once ``abort_fd`` is readable (``AbortableFd``). ``raw``
    is the underlying file (its ``tell()`` gives the compressed bytes read, for progress), None
    for standard input. Raises ``OSError`` when the file cannot be opened."""
    if path == "-":
        stdin = _stdin(abort_fd)
        head = stdin.peek(2)[:2] if hasattr(stdin, "peek") else b""
        if head == GZIP_MAGIC:
            return gzip.GzipFile(fileobj=stdin, mode="rb"), None  # type: ignore[return-value]
        return stdin, None
    raw = open(path, "rb")
    if raw.peek(2)[:2] == GZIP_MAGIC or path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]
    return raw, raw


class _BatchProbe(msgspec.Struct):
    custom_id: Any = msgspec.UNSET
    body: msgspec.Raw = msgspec.Raw()


_batch_probe = msgspec.json.Decoder(_BatchProbe)


def looks_like_openai_batch(line: bytes) -> bool:
    """True when a JSONL line is an OpenAI Batch input line (an object with ``custom_id`` and
    ``body``)."""
    if not line.lstrip().startswith(b"{") or b'"custom_id"' not in line:
        return False
    try:
        p = _batch_probe.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return p.custom_id is not msgspec.UNSET and len(p.body) > 0


def detect_input_format(path: str) -> str:
    """``parquet`` by name, else ``openai-batch`` or ``jsonl`` by the first non-blank line (read
    from the file, gzip-decoded as needed; standard input is ``jsonl``: it cannot be re-read)."""
    if is_parquet_name(path):
        return "parquet"
    if path == "-":
        return "jsonl"
    f, _raw = open_input(path)
    with f:
        seen = 0
        for line in f:
            seen += len(line)
            if line.strip():
                return "openai-batch" if looks_like_openai_batch(line) else "jsonl"
            if seen > SNIFF_BYTES:
                break
    return "jsonl"


def output_format_for(path: str, input_format: str) -> str:
    """``parquet`` for Parquet names; otherwise ``openai-batch`` after OpenAI Batch input, else
    ``jsonl``."""
    if is_parquet_name(path):
        return "parquet"
    return "openai-batch" if input_format == "openai-batch" else "jsonl"


# ---------------------------------------------------------------------------- readers

def read_jsonl(f: IO[bytes]) -> Iterator[tuple[bytes, None]]:
    """Plain JSONL: each line (stripped) is a body; a blank line becomes an empty body (answered
    by an error object downstream, so output line N answers input line N)."""
    for raw in f:
        yield raw.strip(), None


class _BatchLine(msgspec.Struct):
    custom_id: str | None = None
    url: str | None = None
    body: msgspec.Raw = msgspec.Raw()


#: OpenAI Batch ``url`` of a Responses line (issue 14): its body is derendered as kind
#: ``responses`` even without ``responses_request`` (the body alone then has chat's shape)
RESPONSES_URL = "/v1/responses"
#: OpenAI Batch-style ``url`` of an Anthropic Messages line (issue 26): kind ``messages``
MESSAGES_URL = "/v1/messages"


class KindBody(bytes):
    """A derender body whose kind the input told (``kind``: ``responses`` for an OpenAI Batch
    line whose ``url`` is ``/v1/responses``), instead of the body's shape. Pickles with it."""

    kind: str | None = None

    @classmethod
    def of(cls, body: bytes, kind: str) -> KindBody:
        """``body`` tagged with ``kind``."""
        out = cls(body)
        out.kind = kind
        return out


def kind_of_item(item: bytes) -> str | None:
    """The kind an input record was tagged with (``KindBody``), else None (tell by shape)."""
    return getattr(item, "kind", None)


_batch_line = msgspec.json.Decoder(_BatchLine)


def read_openai_batch(f: IO[bytes]) -> Iterator[tuple[bytes | tuple[bytes, int], str | None]]:
    """OpenAI Batch input: ``body`` of each line is the derender body, ``custom_id`` is carried
    to the output; ``method`` is not checked; chat vs completion is told by the body's shape, and a
    ``url`` of ``/v1/responses`` makes the body a Responses one, ``/v1/messages`` a Messages one
    (``KindBody``). A line that is not
    such an object gets a 400 error result."""
    for raw in f:
        line = raw.strip()
        if not line:
            yield (error_body("empty input line", 400), 400), None
            continue
        try:
            rec = _batch_line.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            yield (error_body(f"invalid OpenAI Batch line: {e}", 400), 400), None
            continue
        body = bytes(rec.body)
        if not body or body == b"null":
            yield (error_body("OpenAI Batch line has no body", 400), 400), rec.custom_id
            continue
        if rec.url is not None and rec.url.rstrip("/") == RESPONSES_URL:
            body = KindBody.of(body, "responses")
        elif rec.url is not None and rec.url.rstrip("/") == MESSAGES_URL:
            body = KindBody.of(body, "messages")
        yield body, rec.custom_id


def _drop_nulls(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    return v


_json_any = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _row_body(row: dict[str, Any]) -> bytes:
    body: dict[str, Any] = {}
    for k, v in row.items():
        if v is None:
            continue
        if k in JSON_STRING_FIELDS and isinstance(v, (str, bytes)):
            v = _json_any.decode(v)
        elif isinstance(v, (dict, list)):
            v = _drop_nulls(v)
        body[k] = v
    return _encoder.encode(body)


def parquet_num_rows(path: str) -> int:
    """Rows of a Parquet file, from its footer (no data read)."""
    # deferred: pyarrow (~0.3 s to import) is loaded only for Parquet input/output
    import pyarrow.parquet as pq
    return pq.ParquetFile(path).metadata.num_rows


def read_parquet(path: str, batch_rows: int = 1024, on_batch: Callable[[int], None] | None = None,
                 ) -> Iterator[tuple[bytes | tuple[bytes, int], str | None]]:
    """Parquet input, one row per request, read ``batch_rows`` rows at a time (memory bounded by
    one batch plus one row group's decompressed pages). A ``custom_id`` column is carried to the
    output and not sent; a row whose JSON string column does not parse gets a 400 error result.
    ``on_batch(rows)`` is called after each batch (progress). Raises ``OSError``/
    ``pyarrow.ArrowInvalid`` when the file is not readable Parquet."""
    # deferred: pyarrow (~0.3 s to import) is loaded only for Parquet input/output
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=batch_rows):
        yield from parquet_rows(batch.to_pylist())
        if on_batch is not None:
            on_batch(batch.num_rows)


def parquet_rows(rows: list[dict[str, Any]]) -> Iterator[tuple[bytes | tuple[bytes, int], str | None]]:
    """Rows of field columns (``read_parquet``'s layout) -> ``(body, custom_id)`` items; the
    ``custom_id`` and ``index`` columns are not sent."""
    for row in rows:
        cid = row.pop("custom_id", None)
        cid = None if cid is None else str(cid)
        row.pop("index", None)
        try:
            yield _row_body(row), cid
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            yield (error_body(f"invalid JSON in a Parquet column: {e}", 400), 400), cid


# ---------------------------------------------------------------------------- writers

class JsonlWriter:
    """Plain JSONL out: the result body, one per line (gzip when ``gz``: a reproducible member,
    no file name and mtime 0 in its RFC 1952 header, so the same log gives the same bytes)."""

    def __init__(self, f: IO[bytes], gz: bool = False):
        # filename="": GzipFile would otherwise store the (temporary) file's name in the header
        self._gz = gzip.GzipFile(filename="", fileobj=f, mode="wb", compresslevel=6, mtime=0) if gz else None
        self._f: IO[bytes] = self._gz if self._gz is not None else f  # type: ignore[assignment]

    def write(self, index: int, body: bytes, status: int, custom_id: str | None) -> None:
        """Write one record's result (``index``: 0-based input record number)."""
        self._f.write(body)
        self._f.write(b"\n")

    def close(self) -> None:
        """Flush (and end the gzip member); the file object itself is closed by its owner."""
        if self._gz is not None:
            self._gz.close()


class _Err(msgspec.Struct):
    message: str = ""
    type: str | None = None
    code: int | str | None = None


class _ErrBody(msgspec.Struct):
    error: _Err | None = None


class _RespId(msgspec.Struct):
    id: str | None = None


_err_body = msgspec.json.Decoder(_ErrBody)
_resp_id = msgspec.json.Decoder(_RespId)


_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


def error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI error object, or of the first error object in a JSON
    array of stream chunks (a stream list record with a refused chunk); "" when there is none."""
    if body[:1] == b"[":
        try:
            items = _raw_list.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return ""
        for item in items:
            raw = bytes(item)
            if raw[:1] == b"{" and b'"error"' in raw:
                msg = error_message(raw)
                if msg:
                    return msg
        return ""
    try:
        e = _err_body.decode(body).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""
    return e.message if e is not None else ""


class OpenAIBatchWriter(JsonlWriter):
    """OpenAI Batch output lines (``BatchRequestOutput``; see the module docstring)."""

    def write(self, index: int, body: bytes, status: int, custom_id: str | None) -> None:
        rid = None
        err = None
        if body[:1] == b"{":
            try:
                rid = _resp_id.decode(body).id
            except (msgspec.DecodeError, msgspec.ValidationError):
                rid = None
        if status != 200:
            try:
                e = _err_body.decode(body).error
            except (msgspec.DecodeError, msgspec.ValidationError):
                e = None
            err = {"code": str(e.type or e.code or status) if e else str(status),
                   "message": e.message if e else "request failed"}
        head = _encoder.encode({"id": f"batch_req_{index}", "custom_id": custom_id})
        resp = _encoder.encode({"status_code": status, "request_id": rid})
        line = (head[:-1] + b',"response":' + resp[:-1] + b',"body":' + body + b'},"error":'
                + _encoder.encode(err) + b"}\n")
        self._f.write(line)


#: columns of Parquet output (choice-0 fields flattened; ``response`` is the whole JSON answer)
PARQUET_OUTPUT_COLUMNS = (
    ("index", "int64", "0-based input row/line number"),
    ("custom_id", "string", "the input's custom_id (null when it had none)"),
    ("status_code", "int32", "200, or the error's HTTP status"),
    ("response", "string", "the OpenAI response JSON (a JSON list of chunks for a stream line), or the error object"),
    ("error", "string", "error.message when status_code != 200"),
    ("num_choices", "int32", "len(choices)"),
    ("content", "string", "choice 0: message.content (chat) / text (completion) / the message text (Responses)"),
    ("reasoning", "string", "choice 0: message.reasoning"),
    ("tool_calls", "string", "choice 0: message.tool_calls as JSON (Responses: its function calls, that shape)"),
    ("finish_reason", "string", "choice 0: finish_reason (a Responses result: its status)"),
    ("prompt_tokens", "int64", "usage.prompt_tokens (Responses: input_tokens)"),
    ("completion_tokens", "int64", "usage.completion_tokens (Responses: output_tokens)"),
    ("total_tokens", "int64", "usage.total_tokens"),
)


def parquet_output_schema():
    """The ``pyarrow.Schema`` of Parquet output (``PARQUET_OUTPUT_COLUMNS``)."""
    # deferred: pyarrow (~0.3 s to import) is loaded only for Parquet input/output
    import pyarrow as pa
    return pa.schema([(name, getattr(pa, typ)()) for name, typ, _ in PARQUET_OUTPUT_COLUMNS])


class _Msg(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    tool_calls: msgspec.Raw = msgspec.Raw()


class _Choice(msgspec.Struct):
    message: _Msg | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class _Resp(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


_resp = msgspec.json.Decoder(_Resp)


def flat_row(index: int, body: bytes, status: int, custom_id: str | None) -> dict[str, Any]:
    """One Parquet output row (``PARQUET_OUTPUT_COLUMNS``) of a result. The flattened columns
    are filled from a response object, or from a stream record's list of OpenAI chunks: choice 0's
    non-empty ``content``/``reasoning`` deltas joined (null when there are none: a stream
    cannot tell an empty text from no text), its tool call deltas merged by index (OpenAI's
    streaming rule: ``id``, ``type``, ``name`` on a call's first fragment, ``arguments``
    concatenated), its last ``finish_reason``, the ``usage`` chunk, and the highest choice index
    + 1 as ``num_choices``. Null for an error."""
    row: dict[str, Any] = {"index": index, "custom_id": custom_id, "status_code": status,
                           "response": body.decode("utf-8", "replace"), "error": None, "num_choices": None,
                           "content": None, "reasoning": None, "tool_calls": None, "finish_reason": None,
                           "prompt_tokens": None, "completion_tokens": None, "total_tokens": None}
    if status != 200:
        row["error"] = error_message(body) or None
        return row
    if body[:1] == b"[":
        if body[:40].find(b'"type":"response.') >= 0:  # Responses events (issue 14)
            _flat_responses_events(row, body)
        else:
            _flat_stream(row, body)
        return row
    if body[:1] != b"{":
        return row
    if b'"object":"response"' in body and _is_response(body):  # a Responses result (issue 14)
        _flat_response(row, body)
        return row
    try:
        r = _resp.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return row
    choices = r.choices or []
    row["num_choices"] = len(choices)
    if choices:
        c = choices[0]
        if c.message is not None:
            row["content"] = c.message.content
            row["reasoning"] = c.message.reasoning
            tc = c.message.tool_calls
            if len(tc) and bytes(tc) != b"null":
                row["tool_calls"] = bytes(tc).decode()
        else:
            row["content"] = c.text
        row["finish_reason"] = c.finish_reason
    if r.usage is not None:
        row["prompt_tokens"] = r.usage.prompt_tokens
        row["completion_tokens"] = r.usage.completion_tokens
        row["total_tokens"] = r.usage.total_tokens
    return row


# -------------------------------------------------- Responses API results (issue 14) ---
class _RPart(msgspec.Struct):
    text: str | None = None


class _RItem(msgspec.Struct):
    type: str = ""
    content: list[_RPart] | None = None
    arguments: str | None = None
    name: str | None = None
    call_id: str | None = None


class _RUsage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None


class _RResp(msgspec.Struct):
    object: str | None = None
    output: list[_RItem] | None = None
    usage: _RUsage | None = None
    status: str | None = None


class _REvent(msgspec.Struct):
    type: str = ""
    delta: str | None = None
    response: _RResp | None = None


class _ObjectProbe(msgspec.Struct):
    object: str | None = None


_r_resp = msgspec.json.Decoder(_RResp)
_object_probe = msgspec.json.Decoder(_ObjectProbe)


def _is_response(body: bytes) -> bool:
    try:
        return _object_probe.decode(body).object == "response"
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
_r_events = msgspec.json.Decoder(list[_REvent])


def _fill_response(row: dict[str, Any], r: _RResp) -> None:
    """A Response's flat columns: ``content`` / ``reasoning`` the message / reasoning texts
    joined, ``tool_calls`` its function calls in chat's shape (``id`` = ``call_id``),
    ``finish_reason`` the Response ``status``, usage from ``input_tokens`` / ``output_tokens``."""
    items = r.output or []
    texts = {"message": [], "reasoning": []}
    calls = []
    for it in items:
        if it.type in texts:
            texts[it.type].extend(p.text or "" for p in it.content or [])
        elif it.type == "function_call":
            calls.append({"id": it.call_id, "type": "function",
                          "function": {"name": it.name, "arguments": it.arguments}})
    row["num_choices"] = 1
    row["content"] = "".join(texts["message"]) if texts["message"] else None
    row["reasoning"] = "".join(texts["reasoning"]) if texts["reasoning"] else None
    row["tool_calls"] = _encoder.encode(calls).decode() if calls else None
    row["finish_reason"] = r.status
    if r.usage is not None:
        row["prompt_tokens"] = r.usage.input_tokens
        row["completion_tokens"] = r.usage.output_tokens
        row["total_tokens"] = r.usage.total_tokens


def _flat_response(row: dict[str, Any], body: bytes) -> None:
    try:
        _fill_response(row, _r_resp.decode(body))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return


def _flat_responses_events(row: dict[str, Any], body: bytes) -> None:
    """A list of Responses events: from the terminal event's response when the list has it,
    else the list's text / reasoning deltas joined (one chunk line of a longer stream)."""
    try:
        events = _r_events.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    end = next((e.response for e in reversed(events) if e.type in ("response.completed", "response.incomplete")
                and e.response is not None), None)
    if end is not None:
        _fill_response(row, end)
        return
    text = [e.delta for e in events if e.type == "response.output_text.delta" and e.delta]
    reasoning = [e.delta for e in events if e.type == "response.reasoning_text.delta" and e.delta]
    row["content"] = "".join(text) or None
    row["reasoning"] = "".join(reasoning) or None


class _FnDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolDelta(msgspec.Struct):
    index: int = 0
    id: str | None = None
    type: str | None = None
    function: _FnDelta | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolDelta] | None = None


class _StreamChoice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_StreamChoice] | None = None
    usage: _Usage | None = None


_chunks = msgspec.json.Decoder(list[_Chunk])


def _flat_stream(row: dict[str, Any], body: bytes) -> None:
    try:
        chunks = _chunks.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    n_choices = 0
    seen0 = False
    for ch in chunks:
        if ch.usage is not None:
            row["prompt_tokens"] = ch.usage.prompt_tokens
            row["completion_tokens"] = ch.usage.completion_tokens
            row["total_tokens"] = ch.usage.total_tokens
        for c in ch.choices or []:
            n_choices = max(n_choices, c.index + 1)
            if c.index != 0:
                continue
            seen0 = True
            if c.text:
                content.append(c.text)
            d = c.delta
            if d is not None:
                if d.content:
                    content.append(d.content)
                if d.reasoning:
                    reasoning.append(d.reasoning)
                for t in d.tool_calls or []:
                    call = calls.setdefault(t.index, {"id": None, "type": "function",
                                                      "function": {"name": None, "arguments": ""}})
                    call["id"] = t.id or call["id"]
                    call["type"] = t.type or call["type"]
                    if t.function is not None:
                        call["function"]["name"] = t.function.name or call["function"]["name"]
                        call["function"]["arguments"] += t.function.arguments or ""
            if c.finish_reason is not None:
                row["finish_reason"] = c.finish_reason
    row["num_choices"] = n_choices
    if seen0:
        row["content"] = "".join(content) if content else None
        row["reasoning"] = "".join(reasoning) if reasoning else None
        if calls:
            row["tool_calls"] = _encoder.encode([calls[k] for k in sorted(calls)]).decode()


class ParquetWriter:
    """Parquet output written ``row_group_rows`` rows per row group (memory: one row group of
    responses). Columns: ``PARQUET_OUTPUT_COLUMNS``; zstd-compressed."""

    def __init__(self, f: IO[bytes], row_group_rows: int = 4096):
        # deferred: pyarrow (~0.3 s to import) is loaded only for Parquet input/output
        import pyarrow.parquet as pq
        self._schema = parquet_output_schema()
        self._w = pq.ParquetWriter(f, self._schema, compression="zstd")
        self._rows: list[dict[str, Any]] = []
        self._n = max(1, row_group_rows)

    def write(self, index: int, body: bytes, status: int, custom_id: str | None) -> None:
        """Buffer one result; a full row group is written out."""
        self._rows.append(flat_row(index, body, status, custom_id))
        if len(self._rows) >= self._n:
            self._flush()

    def _flush(self) -> None:
        # deferred: pyarrow (~0.3 s to import) is loaded only for Parquet input/output
        import pyarrow as pa
        if self._rows:
            self._w.write_table(pa.Table.from_pylist(self._rows, schema=self._schema))
            self._rows = []

    def close(self) -> None:
        """Write the last row group and the footer."""
        self._flush()
        self._w.close()


def make_writer(fmt: str, f: IO[bytes], gz: bool = False, row_group_rows: int = 4096):
    """The writer of an output format (``OUTPUT_FORMATS``) over the binary file ``f``."""
    if fmt == "parquet":
        return ParquetWriter(f, row_group_rows)
    if fmt == "openai-batch":
        return OpenAIBatchWriter(f, gz)
    if fmt == "jsonl":
        return JsonlWriter(f, gz)
    raise ValueError(f"unknown output format {fmt!r} (one of {', '.join(OUTPUT_FORMATS)})")


__all__ = ["INPUT_FORMATS", "OUTPUT_FORMATS", "detect_input_format", "output_format_for", "open_input", "AbortableFd",
           "read_jsonl", "read_openai_batch", "read_parquet", "parquet_rows", "parquet_num_rows", "make_writer",
           "JsonlWriter", "OpenAIBatchWriter", "ParquetWriter", "flat_row", "error_message",
           "parquet_output_schema", "PARQUET_OUTPUT_COLUMNS"]
