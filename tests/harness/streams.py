"""Streaming helpers shared by the stream test modules: chunk bodies made from a non-streaming case
(``stream_bodies_from_nonstream``), the in-process stream run, and the stream / non-stream views
compared by parity tests."""
from __future__ import annotations

import json
import random

from tests.parity import service


def run_stream(bodies: list[dict], pieces: bool = False, sizes: list | None = None, svc=None) -> list:
    """Feed bodies in order, one state per request id; the list of chunks (errors included).
    ``pieces``: the streams keep append-only pieces (``derender_stream(pieces=True)``), in
    memory with the store's rules (written at the offset the previous state recorded, read
    truncated to the length the state records); each chunk is first run without a reader, and
    again with one when it asks for stored pieces. ``sizes``: gets each new state's size.
    ``svc``: the service (default: the corpus'), e.g. one in ``incremental`` tool-call mode."""
    svc = svc or service()
    states: dict[str, bytes | None] = {}
    logs: dict[str, bytearray] = {}
    chunks: list = []
    for b in bodies:
        rid = b["generate_chunk"].get("request_id") or ""
        raw = json.dumps(b).encode()
        if pieces:
            log = logs.setdefault(rid, bytearray())
            res, new_state = svc.derender_stream(raw, states.get(rid), pieces=True)
            if res.needs_pieces is not None:
                res, new_state = svc.derender_stream(raw, states.get(rid), pieces=True,
                                                     reader=lambda a, z, log=log: bytes(log[a:z]))
                assert res.needs_pieces is None
            if new_state is not None:
                at = res.pieces_len - len(res.append)
                log[at:] = res.append  # (bytes past the recorded length belong to no state)
        else:
            res, new_state = svc.derender_stream(raw, states.get(rid))
        if sizes is not None and new_state is not None:
            sizes.append(len(new_state))
        out = json.loads(res.body)
        if res.is_error:
            chunks.append(out)
            continue
        assert isinstance(out, list)
        chunks.extend(out)
        states[rid] = new_state
        if res.done:
            states.pop(rid, None)
            logs.pop(rid, None)
    return chunks


def split(n: int, how: str, rng: random.Random) -> list[int]:
    if n == 0:
        return [0]
    if how == "1":
        return [1] * n
    if how == "3":
        return [3] * (n // 3) + ([n % 3] if n % 3 else [])
    out = []
    while n > 0:
        k = min(n, rng.choice([1, 1, 2, 3, 5, 8, 17]))
        out.append(k)
        n -= k
    return out


def stream_bodies_from_nonstream(body: dict, endpoint: str, how: str, seed: int = 0) -> list[dict]:
    """Streaming bodies carrying the same tokens as a non-streaming body, chunked by ``how``."""
    rng = random.Random(seed)
    if endpoint == "chat":
        gr = body["generate_response"]
        rid = gr.get("request_id")
        seqs = [(c["index"], c, body.get("prompt_token_ids") or gr.get("prompt_token_ids"),
                 body.get("prompt_tokens")) for c in gr["choices"]]
        req_key, req = "chat_request", body.get("chat_request")
    else:
        grs = body["generate_responses"]
        rid = grs[0].get("request_id")
        seqs = []
        off = 0
        for pi, g in enumerate(grs):
            pids = (body.get("prompt_token_ids") or [None] * len(grs))[pi] or g.get("prompt_token_ids")
            ptok = (body.get("prompt_tokens") or [None] * len(grs))[pi]
            for c in g["choices"]:
                seqs.append((off + c["index"], c, pids, ptok))
            off += len(g["choices"])
        req_key, req = "completion_request", body.get("completion_request")
    pieces = []  # per sequence: list of choice dicts
    for idx, c, pids, ptok in seqs:
        ids = c["token_ids"]
        lp = (c.get("logprobs") or {}).get("content")
        lens = split(len(ids), how, rng)
        pos = 0
        parts = []
        for si, n in enumerate(lens):
            last = si == len(lens) - 1
            ch = {"index": idx, "token_ids": ids[pos:pos + n],
                  "finish_reason": c.get("finish_reason", "stop") if last else None,
                  "stop_reason": c.get("stop_reason") if last else None}
            if lp is not None:
                ch["logprobs"] = {"content": lp[pos:pos + n]}
            pos += n
            parts.append((ch, pids, ptok))
        pieces.append(parts)
    bodies = []

    def mk(chs, pids, ptok):
        b = {"stream": True, "model": body["model"],
             "generate_chunk": {"request_id": rid, "choices": chs}}
        if pids is not None:
            b["prompt_token_ids"] = pids
        if ptok is not None:
            b["prompt_tokens"] = ptok
        if req is not None:
            b[req_key] = req
        return b

    if how != "random" or len(pieces) == 1:
        for parts in pieces:
            for ch, pids, ptok in parts:
                bodies.append(mk([ch], pids, ptok))
        return bodies
    # interleave the choices; sometimes two choices' pieces in one body (same prompt only)
    queues = [list(p) for p in pieces]
    while any(queues):
        live = [q for q in queues if q]
        q = rng.choice(live)
        ch, pids, ptok = q.pop(0)
        chs = [ch]
        others = [o for o in live if o is not q and o and o[0][1] == pids]
        if others and rng.random() < 0.5:
            o = rng.choice(others)
            chs.append(o.pop(0)[0])
        bodies.append(mk(chs, pids, ptok))
    return bodies


def nonstream_view(resp: dict, endpoint: str) -> dict:
    out = {}
    for ch in resp["choices"]:
        if endpoint == "chat":
            m = ch["message"]
            v = {"content": m.get("content") or None, "reasoning": m.get("reasoning") or None,
                 "tool_calls": [(t["id"], t["function"]["name"], t["function"]["arguments"])
                                for t in m.get("tool_calls") or []]}
            lp = (ch.get("logprobs") or {}).get("content")
            v["lp"] = [e["token"] for e in lp] if lp is not None else None
        else:
            v = {"text": ch["text"]}
            lp = ch.get("logprobs")
            v["lp"] = list(lp["tokens"]) if lp is not None else None
        v["finish_reason"] = ch.get("finish_reason")
        v["stop_reason"] = ch.get("stop_reason")
        out[ch["index"]] = v
    u = resp["usage"]
    usage = {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
             "total_tokens": u["total_tokens"],
             "reasoning": (u.get("completion_tokens_details") or {}).get("reasoning_tokens")}
    return {"choices": out, "usage": usage}


def stream_view(chunks: list, endpoint: str) -> dict:
    acc: dict[int, dict] = {}
    usage = None
    for ck in chunks:
        assert "error" not in ck, ck
        if ck.get("usage"):
            u = ck["usage"]
            usage = {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
                     "total_tokens": u["total_tokens"],
                     "reasoning": (u.get("completion_tokens_details") or {}).get("reasoning_tokens")}
        for cc in ck["choices"]:
            a = acc.setdefault(cc["index"], {"content": "", "reasoning": "", "text": "", "tc": {},
                                             "lp": None, "finish_reason": None, "stop_reason": None})
            if endpoint == "chat":
                d = cc["delta"]
                a["content"] += d.get("content") or ""
                a["reasoning"] += d.get("reasoning") or ""
                for t in d.get("tool_calls") or []:
                    x = a["tc"].setdefault(t["index"], [None, "", ""])
                    if t.get("id"):
                        assert x[0] is None, "id sent twice"
                        x[0] = t["id"]
                        assert t.get("type") == "function" and (t.get("function") or {}).get("name")
                    x[1] += (t.get("function") or {}).get("name") or ""
                    x[2] += (t.get("function") or {}).get("arguments") or ""
                lp = (cc.get("logprobs") or {}).get("content")
                if lp is not None:
                    a["lp"] = (a["lp"] or []) + [e["token"] for e in lp]
            else:
                a["text"] += cc["text"]
                lp = cc.get("logprobs")
                if lp is not None:
                    a["lp"] = (a["lp"] or []) + list(lp["tokens"])
            if cc.get("finish_reason") is not None:
                assert a["finish_reason"] is None, "finish_reason sent twice"
                a["finish_reason"] = cc["finish_reason"]
                a["stop_reason"] = cc.get("stop_reason")
    out = {}
    for i, a in acc.items():
        if endpoint == "chat":
            v = {"content": a["content"] or None, "reasoning": a["reasoning"] or None,
                 "tool_calls": [tuple(a["tc"][k]) for k in sorted(a["tc"])], "lp": a["lp"]}
        else:
            v = {"text": a["text"], "lp": a["lp"]}
        v["finish_reason"] = a["finish_reason"]
        v["stop_reason"] = a["stop_reason"]
        out[i] = v
    return {"choices": out, "usage": usage}
