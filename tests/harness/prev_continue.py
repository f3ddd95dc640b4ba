"""Run by the previous release's own code (``python3 -P <this file> IN OUT [MODELS]`` with ``PYTHONPATH`` and
the working directory set to a worktree of that release, ``tests/chaos/releases.py``; MODELS: the
served models file, default that release's ``tests/data/models.json``): continue
streams from stored values another release wrote, with the previous release's decoder and core
(``tests/test_state_golden.py``), or answer streams and non-streaming records from the start
(that release's expected replies in a rolling scenario, ``tests/chaos/replies.py``). Imports only what that release has (its ``worker`` package,
msgspec): never this release's modules.

IN (msgpack): a list of jobs ``{name, chunks: [bytes], start, created, model, checkpoint, state,
settings, pieces}``: ``checkpoint`` (a stored checkpoint value, seq digits first) or ``state``
(the state bytes) or neither (a new stream), ``settings`` / ``pieces`` (the stored side keys'
values, or None). Each job's chunks ``[start, n)`` go through the release's
``derender_stream_job`` with seqs ``start..n-1``, the stream's pieces read back as its worker
does; a job ``{name, single: bytes, created}`` is one non-streaming record (``derender``). OUT
(msgpack): ``{name: {bodies: [bytes], statuses: [int], norm: bytes | None, norm_settings: bytes | None}}``:
the reply bodies and statuses, and the start state and settings decoded by that release and encoded again
(None for none): its reading of them in its own bytes."""
from __future__ import annotations

import sys
from pathlib import Path

import msgspec


def _norm(svc, model: str, state: bytes | None, settings: bytes | None) -> tuple[bytes | None, bytes | None]:
    """The release's own reading of a stream ``state`` and its ``settings``, encoded again (None
    for none); the state's settings digest is that of the settings so encoded."""
    from worker.core.responses import derender as responses
    from worker.core.stream_state import decode_settings, decode_state, encode_settings, encode_state
    from worker.core.stream_state import settings_digest as digest
    if state is None:
        return None, None
    rt = svc.runtime(model)
    if state[:5] == b"\xc1RSP2":
        return state[:5] + responses.encode_state(responses.decode_state(rt, state[5:])), None
    if state[:5] == b"\xc1MSG2":  # (a Messages stream: releases from 638fca1 on)
        from worker.core.messages import derender as messages
        return state[:5] + messages.encode_state(*messages.decode_state(rt, state[5:])), None
    st = decode_state(rt, state)
    norm_settings = None
    if settings is not None:
        norm_settings = encode_settings(decode_settings(rt, settings))
        st.settings_digest = digest(norm_settings)
    return encode_state(st), norm_settings


def _run(svc, job: dict) -> dict:
    from worker.transport.checkpoints import decode_checkpoint
    if job.get("single") is not None:
        r = svc.derender(job["single"], created=job["created"])
        return {"bodies": [r.body], "statuses": [int(r.status)], "norm": None, "norm_settings": None}
    from worker.transport.jobs import derender_stream_job
    state = job.get("state")
    if job.get("checkpoint") is not None:
        state = decode_checkpoint(job["checkpoint"][20:]).state
    settings = job.get("settings")
    norm, norm_settings = _norm(svc, job["model"], state, settings)
    pieces = bytearray(job.get("pieces") or b"")
    bodies, statuses = [], []
    for seq in range(job["start"], len(job["chunks"])):
        give = None
        for _ in range(3):
            out = derender_stream_job(svc, job["chunks"][seq], state, seq, job.get("kind"), job["created"], give,
                                      settings)
            if out.needs_pieces is not None:
                a, b = out.needs_pieces
                give = (a, bytes(pieces[a:b]))
            elif not out.needs_settings:
                break
        if out.needs_pieces is not None or out.needs_settings:
            raise RuntimeError(f"{job['name']} seq {seq}: pieces or settings still missing")
        if out.settings:
            settings = out.settings
        if out.pieces_len:
            at = out.pieces_len - len(out.append)
            pieces[at:] = out.append
        state = out.state
        bodies.append(out.body)
        statuses.append(int(out.status))
    return {"bodies": bodies, "statuses": statuses, "norm": norm, "norm_settings": norm_settings}


def main() -> None:
    from worker.config import load_config_file
    from worker.core.service import DerenderService
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    models = sys.argv[3] if len(sys.argv) > 3 else str(Path.cwd() / "tests" / "data" / "models.json")
    svc = DerenderService(load_config_file(models))
    jobs = msgspec.msgpack.decode(src.read_bytes())
    dst.write_bytes(msgspec.msgpack.encode({job["name"]: _run(svc, job) for job in jobs}))


if __name__ == "__main__":
    main()
