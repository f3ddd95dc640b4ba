"""Bounded stream state: an open call's text spilled to the stream's append-only pieces.

What a choice's parsers no longer read before a call closes (the start of an open call's body,
an open XML call's sent entries, required/named content held for JSON parsing) leaves the
choice state for the ``PieceLog`` once ``SPILL_CHARS`` are held, with a running CRC-32 per
range list; it is read back (and checked) when the call closes or the output ends. The rule and
its figures: ``docs/streaming.md``.
"""

from __future__ import annotations

import zlib

from worker.core.derender import ModelRuntime
from worker.core.responses.log import PieceLog, PiecesLost
from worker.core.stream_state import ChoiceState, StreamState

#: an open call's body is spilled once this many characters of it are held in the state; what
#: stays is what the parser still reads (from its end-marker search / lexer / streamer offsets)
SPILL_CHARS = 1024


def clear_spills(cs: ChoiceState) -> None:
    """No spilled ranges (and their CRCs) left in ``cs``."""
    cs.spill = []
    cs.spill_args = []
    cs.spill_held = []
    cs.spill_crc = cs.spill_args_crc = cs.spill_held_crc = 0


def read_ranges(pieces: PieceLog, ranges: list[int], crc: int) -> str:
    """The text spilled to ``ranges`` of ``pieces``, whose bytes had CRC-32 ``crc`` when written
    (``append``). Raises ``PiecesLost`` when the bytes read are not those (another CRC, or not
    UTF-8): the pieces were overwritten, and no reply is built from them."""
    data = b"".join(pieces.read(ranges[i], ranges[i] + ranges[i + 1]) for i in range(0, len(ranges), 2))
    if zlib.crc32(data) != crc:
        raise PiecesLost(f"the stream's pieces are corrupted ({len(data)} bytes read, not the ones written: "
                         "another CRC-32): they were lost or expired, or overwritten")
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:  # bytes the store holds are not what was spilled
        raise PiecesLost(f"the stream's pieces are corrupted ({e.reason} at byte {e.start} of "
                         f"{len(data)} read): they were lost or expired, or overwritten") from None


def need_every_spill(st: StreamState, pieces: PieceLog) -> None:
    """Without a reader, ask for the stored bytes of every spilled body of the stream at once:
    ``PiecesNeeded`` over the span from the first range of any choice to the end of the last
    (``PieceLog.read``). A caller that then reads only that span (the Kafka worker reads what
    ``needs_pieces`` names) has the bytes of every choice that closes in this chunk and of each
    of their ranges, however the choices' spills interleave; one range at a time, a second range
    or choice read past the fetched bytes and a live stream got the 409 "lost or expired"."""
    if pieces.reader is not None:
        return
    lo = hi = -1
    for c in st.choices.values():
        for r in (c.spill, c.spill_args, c.spill_held):
            if r:
                lo = r[0] if lo < 0 else min(lo, r[0])
                hi = max(hi, r[-2] + r[-1])
    if lo >= 0:
        pieces.read(lo, hi)


def unspill(rt: ModelRuntime, cs: ChoiceState, pieces: PieceLog) -> None:
    """Bring the open call's spilled start (and its spilled sent XML entries, and the
    required/named content held for JSON parsing) back from ``pieces`` into its parser state.
    Raises ``PiecesLost`` (the 409 "lost or expired") when the stored bytes are too few, not
    the ones written (CRC-32), not UTF-8, or not as many characters as were spilled: the pieces were lost, truncated or
    overwritten (a wrong reply is never built from them)."""
    stack = rt.stack
    tool = stack.tool
    ps = cs.parser
    try:
        if cs.spill:
            tool.unspill(ps.tool, read_ranges(pieces, cs.spill, cs.spill_crc))
        if cs.spill_args or (ps.tool is not None and tool.args_spilled(ps.tool)):
            tool.unspill_args(ps.tool, read_ranges(pieces, cs.spill_args, cs.spill_args_crc))
        if cs.spill_held or ps.held_spilled:
            stack.unspill_held(ps, read_ranges(pieces, cs.spill_held, cs.spill_held_crc))
    except ValueError as e:  # (the unspill character count checks)
        raise PiecesLost(f"the stream's pieces are corrupted ({e}): they were lost or expired, or overwritten") from None
    clear_spills(cs)


def append(pieces: PieceLog, ranges: list[int], text: str, crc: int) -> int:
    """Append ``text`` to ``pieces``, its byte range added to ``ranges`` (joined to the last one
    when they touch); returns the running CRC-32 ``crc`` of the ranges' bytes with it
    (``read_ranges`` checks it)."""
    data = text.encode("utf-8", "surrogatepass")
    at = len(pieces)
    pieces.new += data
    if ranges and ranges[-2] + ranges[-1] == at:
        ranges[-1] += len(data)
    else:
        ranges += [at, len(data)]
    return zlib.crc32(data, crc)


def spill(rt: ModelRuntime, cs: ChoiceState, pieces: PieceLog) -> None:
    """Move what the choice's parsers no longer read before a call closes or the output ends
    out of the choice state, appended to ``pieces``: the start of an open tool call's body
    (once ``SPILL_CHARS`` are held; ``ToolParser.body_held`` / ``spill_point`` / ``spill``),
    the open XML call's sent entries (``ToolParser.spill_args``) and the required/named
    content held for JSON parsing (``ParserStack.spill_held``)."""
    ps = cs.parser
    if ps is None:
        return
    if len(ps.held) >= SPILL_CHARS:
        cs.spill_held_crc = append(pieces, cs.spill_held, rt.stack.spill_held(ps), cs.spill_held_crc)
    if ps.tool is None:
        return
    tool = rt.stack.tool
    if tool.body_held(ps.tool) >= SPILL_CHARS:
        k = tool.spill_point(ps.tool)
        if k >= SPILL_CHARS // 2:
            cs.spill_crc = append(pieces, cs.spill, tool.spill(ps.tool, k), cs.spill_crc)
    if tool.spill_args_due(ps.tool, SPILL_CHARS):
        text, fresh = tool.spill_args(ps.tool, max(1, SPILL_CHARS // 4))
        if fresh:
            cs.spill_args = []
            cs.spill_args_crc = 0
        if text:
            cs.spill_args_crc = append(pieces, cs.spill_args, text, cs.spill_args_crc)
