"""Issue 23 item 1: the stream state of each earlier release a pool may still run
(``tests/chaos/releases.py`` ``EARLIER_RELEASES``: e8f2be2, golden set ``v6``; 638fca1, golden set
``v6-638fca1``, with its Anthropic Messages streams; both state format 6, written by real Kafka
workers of those releases, ``tests/data/golden_state/``) is read by this one, both ways:

* every golden value is probed as format 6, decodes (checkpoint, tombstone, chat/completion state
  and settings, Responses and Messages state) and keeps the v6 field layout (a frozen copy of
  e8f2be2's ``Checkpoint`` / ``ReplayEntry``, state and settings versions);
* a worker of this release (real broker, real Redis) given the golden mid-stream keys continues
  each stream: its replies equal the in-process core's bytes of an uninterrupted run, and the
  tombstone it writes is byte-identical to the one that release wrote;
* the keys it writes for the first half of each stream (the format it selects while that release
  may be in the group) are read by that release's own code (a worktree of it,
  ``tests/chaos/releases.py``, running ``tests/harness/prev_continue.py``) with the same meaning:
  it decodes them to what it decodes from its own golden keys, and continuing each stream it
  answers the second half with the golden replies. Pieces, the replay window and the completion
  checkpoint and settings are byte-identical; a stream whose state holds a parser state is
  compared by that release's reading only: this release may add trailing fields it ignores
  (``ThinkState``'s ``closed`` / ``held_len`` / ``held_in`` for e8f2be2, docs/delivery.md "Rolling
  upgrades across releases"), and the state records the digest of its settings' bytes;
* every parser state type is read by each earlier release with its fields set, both ways;
* a Qwen3 stream cut while this release holds a ``<tool_call>`` met inside ``<think>`` (the held
  mode, stored as reasoning text still to emit) is continued by e8f2be2 with e8f2be2's own
  uninterrupted answer: the held text comes out as reasoning.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import msgspec
import pytest
import redis

from tests.chaos.releases import EARLIER_RELEASES, NotAGitCheckout, release_tree
from tests.harness.golden_state import MODELS, TS_MS, load_streams, run_phase, v6_read
from tests.harness.kafka import REDIS_URL, qwen3_stream
from worker.config import load_config_file
from worker.core.service import DerenderService
from worker.state import formats
from worker.transport.checkpoints import decode_stored
from worker.transport.jobs import derender_stream_job

DATA = Path(__file__).resolve().parent / "data"
#: (release, its golden directory, its golden streams), oldest first
SETS = [(r, DATA / "golden_state" / d, load_streams(DATA / "golden_state" / d / "streams.json"))
        for r, d in EARLIER_RELEASES.items()]
SET_IDS = [r[:7] for r, _, _ in SETS]
E8F2BE2 = next(r for r in EARLIER_RELEASES if r.startswith("e8f2be2"))
PREV_CONTINUE = Path(__file__).resolve().parent / "harness" / "prev_continue.py"
#: streams whose state holds no parser state: every stored value byte-identical across releases
NO_PARSER_STATE = {"completion"}
#: streams that have a piece log at their cut
WITH_PIECES = {"bigcall", "responses", "messages", "messages-ws", "messages-text"}


@pytest.fixture(scope="module")
def release():
    """``release(commit)``: a worktree of that release (``tests/chaos/releases.py``), made once per
    module; the test is skipped outside a git checkout."""
    with contextlib.ExitStack() as stack:
        made: dict[str, Path] = {}

        def get(commit: str) -> Path:
            if commit not in made:
                try:
                    made[commit] = stack.enter_context(release_tree(commit))
                except NotAGitCheckout as e:
                    pytest.skip(str(e))
            return made[commit]
        yield get


@functools.cache
def _service() -> DerenderService:
    return DerenderService(load_config_file(str(MODELS)))


def prev_run(tree: Path, jobs: list[dict]) -> dict:
    """``tests/harness/prev_continue.py`` run by the release checked out at ``tree`` over ``jobs``
    (served models: ``MODELS``)."""
    with tempfile.TemporaryDirectory(prefix="prev-continue-") as d:
        src, dst = Path(d) / "in", Path(d) / "out"
        src.write_bytes(msgspec.msgpack.encode(jobs))
        env = dict(os.environ, PYTHONPATH=str(tree))
        r = subprocess.run([sys.executable, "-P", str(PREV_CONTINUE), str(src), str(dst), str(MODELS)], cwd=tree,
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
        return msgspec.msgpack.decode(dst.read_bytes())


def _model(s) -> str:
    return json.loads(s["chunks"][0])["model"]


def _job(s, start: int, values: dict[str, bytes]) -> dict:
    return {"name": s["name"], "chunks": s["chunks"], "start": start, "kind": s["kind"], "created": TS_MS // 1000,
            "model": _model(s), "checkpoint": values.get("checkpoint"), "settings": values.get("settings"),
            "pieces": values.get("pieces")}


def _files(golden: Path, name: str) -> dict[str, bytes]:
    return {p.name.split(".", 1)[1]: p.read_bytes() for p in golden.glob(f"{name}.*")}


@pytest.mark.parametrize("golden,s", [(g, s) for _, g, sts in SETS for s in sts],
                         ids=[f"{i}-{s['name']}" for i, (_, _, sts) in zip(SET_IDS, SETS) for s in sts])
def test_golden_values_are_format_6_and_decode(golden, s):
    files = _files(golden, s["name"])
    mid, end = files["mid.checkpoint"], files["end.checkpoint"]
    for value, seq in ((mid, s["cut"] - 1), (end, len(s["chunks"]) - 1)):
        assert int(value[:20]) == seq
        assert formats.probe_checkpoint(value[20:]) == 6
        ck = decode_stored(value[20:])
        assert ck == decode_stored(formats.checkpoint_in(value[20:]))
        old = v6_read(value)
        assert [(e.seq, e.status, e.value) for e in ck.replies] == [(e.seq, e.status, e.value) for e in old.replies]
        assert [e.seq for e in ck.replies] == list(range(seq + 1))
    assert decode_stored(mid[20:]).state is not None and decode_stored(end[20:]).state is None  # a tombstone
    assert ("mid.settings" in files) == (s["name"] in ("chat", "bigcall", "completion"))
    if "mid.settings" in files:
        assert msgspec.msgpack.decode(files["mid.settings"])[0] == 6
        assert formats.settings_in(files["mid.settings"]) == files["mid.settings"]
    assert ("mid.pieces" in files) == (s["name"] in WITH_PIECES)


def _uninterrupted(s) -> list[bytes]:
    """Reply bodies of the whole stream through the in-process core (the pool job the worker runs)."""
    svc = _service()
    state, settings, pieces, out_bodies = None, None, bytearray(), []
    for seq, body in enumerate(s["chunks"]):
        give = None
        for _ in range(3):
            out = derender_stream_job(svc, body, state, seq, s["kind"], TS_MS // 1000, give, settings)
            if out.needs_pieces is not None:
                a, b = out.needs_pieces
                give = (a, bytes(pieces[a:b]))
            elif not out.needs_settings:
                break
        assert out.needs_pieces is None and not out.needs_settings
        if out.settings:
            settings = out.settings
        if out.pieces_len:
            at = out.pieces_len - len(out.append)
            pieces[at:] = out.append
        state = out.state
        out_bodies.append(out.body)
    return out_bodies


@pytest.mark.kafka
@pytest.mark.redis
@pytest.mark.parametrize("rel,golden,sts", SETS, ids=SET_IDS)
def test_this_release_continues_golden_streams_and_writes_what_they_read(kafka_bootstrap, kafka_broker_kind,
                                                                         redis_prefix, release, rel, golden, sts):
    """Continue: the golden mid-stream keys under a fresh prefix, a worker of this release
    answers the second half of every stream; replies = the uninterrupted run's, tombstones = the
    golden ones. Write: a worker of this release answers the first half of every stream under
    another prefix; the keys it wrote are the golden bytes, except the checkpoint and settings of
    a stream with a parser state (same seq and replay window; trailing fields the earlier release
    ignores); the earlier release's own code reads them as its golden keys and continues each
    stream with the golden replies."""
    models = load_config_file(str(MODELS))
    sync = redis.Redis.from_url(REDIS_URL)
    for s in sts:
        key = f"{redis_prefix}{{{s['rid']}}}"
        for name, value in _files(golden, s["name"]).items():
            if name.startswith("mid."):
                suffix = {"checkpoint": "", "settings": ":settings", "pieces": ":pieces"}[name[4:]]
                sync.set(key + suffix, value, px=600_000)
    end, replies = asyncio.run(run_phase(kafka_bootstrap, kafka_broker_kind, models, redis_prefix, sts, "rest"))
    by_key: dict[bytes, dict[int, bytes]] = {}
    for r in replies:
        h = dict(r.headers)
        by_key.setdefault(r.key, {})[int(h["derender-seq"])] = r.value
    for s in sts:
        want = _uninterrupted(s)
        got = by_key[s["rid"].encode()]
        assert sorted(got) == list(range(s["cut"], len(s["chunks"]))), s["name"]
        for seq in got:
            assert got[seq] == want[seq], (s["name"], seq, got[seq][:200], want[seq][:200])
        assert end[s["name"]]["checkpoint"] == _files(golden, s["name"])["end.checkpoint"], s["name"]
        v6_read(end[s["name"]]["checkpoint"])

    other = redis_prefix + uuid.uuid4().hex[:6] + ":"
    try:
        mid, _ = asyncio.run(run_phase(kafka_bootstrap, kafka_broker_kind, models, other, sts, "first"))
    finally:
        keys = list(sync.scan_iter(match=other + "*"))
        if keys:
            sync.delete(*keys)
    changed: set[str] = set()
    for s in sts:
        files = _files(golden, s["name"])
        assert set(mid[s["name"]]) == {n[4:] for n in files if n.startswith("mid.")}
        for name, value in mid[s["name"]].items():
            if name == "checkpoint" and s["name"] not in NO_PARSER_STATE:
                ours, old = v6_read(value), v6_read(files["mid.checkpoint"])
                assert value[:20] == files["mid.checkpoint"][:20]
                # the same replayed seqs as the earlier release kept; their bodies are this
                # release's (a deliberate reply change, e.g. issue 26's whitespace delta, shows here)
                assert [(r.seq, r.status, r.end, r.kind) for r in ours.replies] == \
                    [(r.seq, r.status, r.end, r.kind) for r in old.replies], s["name"]
                want = _uninterrupted(s)
                assert [r.value for r in ours.replies] == [want[r.seq] for r in ours.replies], s["name"]
                if [r.value for r in ours.replies] != [r.value for r in old.replies]:
                    changed.add(s["name"])
            elif name == "settings" and s["name"] not in NO_PARSER_STATE:
                assert msgspec.msgpack.decode(value)[0] == 6
            elif name == "checkpoint":
                _same_but_trailing(value, files["mid.checkpoint"], s["name"])
            else:
                assert value == files[f"mid.{name}"], (s["name"], name)
                if name == "checkpoint":
                    v6_read(value)
    _prev_continues(release(rel), golden, sts, mid, changed)


#: trailing ``ChoiceState`` fields added since the golden release, as written at their defaults
#: (``held_stop_id``: a stream's held-back EOS id, -1: none)
CHOICE_STATE_ADDED = [-1]


def _same_but_trailing(ours: bytes, old: bytes, name: str) -> None:
    """A stored checkpoint of a stream without parser state: the golden bytes, or the same values
    with ``CHOICE_STATE_ADDED`` appended to each choice's array (the earlier release ignores
    trailing fields; ``_prev_continues`` then reads and continues it with that release's code)."""
    if ours == old:
        return
    a, b = v6_read(ours), v6_read(old)
    assert msgspec.structs.replace(a, state=None) == msgspec.structs.replace(b, state=None), name
    sa, sb = msgspec.msgpack.decode(a.state), msgspec.msgpack.decode(b.state)
    assert sa[:4] + sa[5:] == sb[:4] + sb[5:], name  # StreamState; [4]: choices
    assert sa[4].keys() == sb[4].keys(), name
    for k, cs in sb[4].items():
        assert sa[4][k] == cs + CHOICE_STATE_ADDED, (name, k)


def _prev_continues(tree: Path, golden: Path, sts: list[dict], mid: dict, changed: set[str] = frozenset()) -> None:
    """The earlier release reads what this release wrote at each golden stream's cut (``mid``: the
    stream's stored values) as it reads its own golden values, and continues each stream with its
    golden replies (its uninterrupted run's, in the golden tombstone's replay window). ``changed``:
    streams whose replies before the cut this release changes on purpose; their stored counters
    (e.g. events sent) differ, so only the continuation is compared."""
    jobs = [_job(s, s["cut"], mid[s["name"]]) for s in sts]
    jobs += [dict(_job(s, len(s["chunks"]), {n[4:]: v for n, v in _files(golden, s["name"]).items()
                                             if n.startswith("mid.")}), name=s["name"] + ":golden") for s in sts]
    got = prev_run(tree, jobs)
    for s in sts:
        name = s["name"]
        if name not in changed:
            assert got[name]["norm"] == got[name + ":golden"]["norm"], name
        assert got[name]["norm"] is not None
        assert got[name]["norm_settings"] == _files(golden, name).get("mid.settings"), name
        golden_replies = {e.seq: e.value for e in v6_read(_files(golden, name)["end.checkpoint"]).replies}
        bodies = got[name]["bodies"]
        assert len(bodies) == len(s["chunks"]) - s["cut"], name
        for seq, body in enumerate(bodies, s["cut"]):
            assert body == golden_replies[seq], (name, seq, body[:200], golden_replies[seq][:200])


def _join(bodies: list[bytes]) -> dict:
    """The joined answer of chat stream reply bodies: reasoning, content, calls (name, arguments),
    finish reasons."""
    out = {"reasoning": "", "content": "", "calls": {}, "finish": []}
    for body in bodies:
        for chunk in json.loads(body):
            for c in chunk["choices"]:
                d = c["delta"]
                out["reasoning"] += d.get("reasoning") or d.get("reasoning_content") or ""
                out["content"] += d.get("content") or ""
                for tc in d.get("tool_calls") or []:
                    call = out["calls"].setdefault(tc["index"], {"name": "", "arguments": ""})
                    fn = tc.get("function") or {}
                    call["name"] += fn.get("name") or ""
                    call["arguments"] += fn.get("arguments") or ""
                if c.get("finish_reason"):
                    out["finish"].append(c["finish_reason"])
    return out


def _first_half(s: dict) -> tuple[list[bytes], bytes, bytes | None, bytes]:
    """This release's in-process run of chunks ``[0, cut)``: reply bodies, state, settings, pieces."""
    svc = _service()
    state, settings, pieces, bodies = None, None, bytearray(), []
    for seq in range(s["cut"]):
        out = derender_stream_job(svc, s["chunks"][seq], state, seq, s["kind"], TS_MS // 1000, None, settings)
        assert out.needs_pieces is None and not out.needs_settings and out.status == 200
        settings = out.settings or settings
        if out.pieces_len:
            pieces[out.pieces_len - len(out.append):] = out.append
        state = out.state
        bodies.append(out.body)
    return bodies, state, settings, bytes(pieces)


def _held_cut(s: dict) -> int:
    """The first chunk after which this release's Qwen3 reasoning parser holds ``<tool_call>`` and
    some of its JSON (the held mode, at rest: ``held_len`` characters of reasoning text)."""
    from worker.core.stream_state import decode_state
    svc = _service()
    state, settings = None, None
    for seq, body in enumerate(s["chunks"]):
        out = derender_stream_job(svc, body, state, seq, s["kind"], TS_MS // 1000, None, settings)
        settings, state = out.settings or settings, out.state
        st = decode_state(svc.runtime("qwen3"), state)
        think = st.choices[0].parser.reasoning
        if think.held_len > len("<tool_call>") + 8:
            assert think.mode == "reasoning" and think.buf.startswith("<tool_call>")
            return seq + 1
    raise AssertionError("the stream never held a tool call")


@pytest.mark.parametrize("closed", [False, True], ids=["no-think-end", "think-end-later"])
def test_previous_release_continues_a_held_tool_call(release, closed):
    """Cut while a ``<tool_call>`` inside ``<think>`` is held (no ``</think>`` yet): e8f2be2 continues
    the stream from this release's state with its own answer (the held text as reasoning): the
    replies after the first of the second half are its uninterrupted run's bytes, and the stream
    joined across the releases is its uninterrupted answer."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(DATA / "tokenizers" / "qwen3" / "tokenizer.json"))
    text = ('<think>\nThe user wants Oslo.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
            '\n</tool_call>\n' + ("That call was only a sketch.\n</think>\n\nIt is sunny." if closed else ""))
    _, chunks = qwen3_stream(tok, "held-" + str(closed), text, "Oslo")
    s = {"name": "held", "rid": "held", "kind": "chat-stream", "chunks": chunks, "cut": 0}
    s["cut"] = _held_cut(s)
    ours, state, settings, pieces = _first_half(s)
    got = prev_run(release(E8F2BE2), [dict(_job(s, s["cut"], {"settings": settings, "pieces": pieces}), state=state),
                               dict(_job(s, 0, {}), name="whole")])
    rest, whole = got["held"]["bodies"], got["whole"]["bodies"]
    assert len(rest) == len(chunks) - s["cut"] and len(whole) == len(chunks)
    assert rest[1:] == whole[s["cut"] + 1:]
    joined, want = _join(ours + rest), _join(whole)
    assert joined == want
    assert "<tool_call>" in want["reasoning"] and not want["calls"]
    assert _join(ours)["reasoning"] + _join(rest)["reasoning"] == want["reasoning"]


_PREV_LAYOUT = """
import importlib, sys, msgspec
from msgspec.structs import asdict

def filled(t):
    kw = {}
    for f in msgspec.structs.fields(t):
        if f.required:
            return None
        d = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        kw[f.name] = f.name + "!" if f.type is str else (not d) if f.type is bool else \\
            d + 7 if f.type is int else d
    return t(**kw)

out = {}
for mod, name, blob in msgspec.msgpack.decode(sys.stdin.buffer.read()):
    try:
        t = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError):
        continue
    if filled(t) is None:
        out[name] = None
        continue
    try:
        read = asdict(msgspec.msgpack.decode(blob, type=t))
    except msgspec.ValidationError as e:
        read = str(e)
    out[name] = [read, msgspec.msgpack.encode(filled(t))]
sys.stdout.buffer.write(msgspec.msgpack.encode(out))
"""


def _parser_state_types() -> list[type]:
    """The Structs of ``worker.parsers`` (the parser states a stream state holds: array-like, and
    the map-encoded ``StackState``)."""
    import importlib
    import pkgutil

    import worker.parsers
    out = []
    for m in pkgutil.walk_packages(worker.parsers.__path__, "worker.parsers."):
        for v in vars(importlib.import_module(m.name)).values():
            if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == m.name:
                out.append(v)
    return out


def _plain(x):
    """``x`` as msgpack decodes it (nested Structs as lists, as the other release sent them)."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(x))


@pytest.mark.parametrize("rel", list(EARLIER_RELEASES), ids=SET_IDS)
def test_parser_states_are_read_by_the_previous_release_both_ways(release, rel):
    """Every parser state type the earlier release also has (same module and name): this
    release's state with every str / bool / int field set decodes in that release to the same
    values of its fields (new fields are trailing: ignored), and its such state decodes here to
    its values, the new fields at their defaults. Catches a field added before a subclass's
    fields (the wrapped and Gemma 4 think states: ``ThinkFields``), and a renamed or retyped
    field of a map-encoded state (``StackState``: ``lead_ws`` / ``text_seen`` are 638fca1's)."""
    from msgspec.structs import asdict
    ns: dict = {}
    exec(compile(_PREV_LAYOUT.split("out = {}")[0], "layout", "exec"), ns)  # the same filler here
    types = [t for t in _parser_state_types() if ns["filled"](t) is not None]
    assert {"ThinkState", "WrappedThinkState", "Gemma4ThinkState", "TaggedState", "StackState"} <= {
        t.__name__ for t in types}
    jobs = [(t.__module__, t.__name__, msgspec.msgpack.encode(ns["filled"](t))) for t in types]
    tree = release(rel)
    r = subprocess.run([sys.executable, "-P", "-c", _PREV_LAYOUT], input=msgspec.msgpack.encode(jobs), cwd=tree,
                       env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-4000:]
    got = msgspec.msgpack.decode(r.stdout)
    assert {"ThinkState", "WrappedThinkState", "Gemma4ThinkState", "TaggedState", "StackState"} <= set(got)
    for t in types:
        if got.get(t.__name__) is None:  # (a type that release does not have, or not with defaults)
            continue
        theirs, their_blob = got[t.__name__]
        assert isinstance(theirs, dict), (t.__name__, theirs)  # (else: that release's decode error)
        ours = _plain(asdict(ns["filled"](t)))
        assert theirs == {k: ours[k] for k in theirs}, t.__name__
        back = _plain(asdict(msgspec.msgpack.decode(their_blob, type=t)))
        default = _plain(asdict(t()))
        assert back == {k: theirs.get(k, default[k]) for k in back}, t.__name__
