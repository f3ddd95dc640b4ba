"""gpt-oss (Harmony) on its real vocabulary, checked against OpenAI's own Harmony parser.

The tokenizer is ``o200k_harmony`` built offline from the ranks the ``bpe-openai`` package ships
(``worker.core.tiktoken_vocab``). The reference is ``openai-harmony`` (the library vLLM parses
gpt-oss output with), loading the same ranks offline through ``TIKTOKEN_ENCODINGS_BASE``:

* its encoder turns each vector's Harmony text into the token ids the model would emit (markers
  as special tokens; a ``LIT`` part is ordinary text, so a literal ``<|channel|>`` in a body is
  not markup), and our tokenizer must encode/decode the same way;
* its ``StreamableParser`` (role ``assistant``: the prompt ends with ``<|start|>assistant``) splits
  the ids into messages; :func:`expected` maps them to the chat fields as vLLM's serving does
  (analysis -> reasoning; final and commentary preambles -> content; a message to
  ``functions.NAME`` on any channel -> a tool call; the streaming concatenation, no ``\\n``
  between messages) plus the product's rule for a call cut by the end of output (its raw text
  stays content, never a call).

Every vector runs through the service non-streaming and streaming (chunks of 1 and 3 tokens and
random sizes, state bytes carried between chunks), with and without tools.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import shutil
from pathlib import Path

import pytest

from worker.config import ServedModelConfig
from worker.core.service import DerenderService
from worker.core.tiktoken_vocab import HARMONY_SPECIAL_TOKENS, _packaged_ranks

harmony = pytest.importorskip("openai_harmony")  # in the `test` extra: present in CI
MODEL = "gpt-oss"
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
         for n in ("get_weather", "get_time", "grep")]


class LIT(str):
    """A vector part encoded as ordinary text (special-token strings in it are not markup)."""


# (id, parts of the output after the prompt's "<|start|>assistant", finish_reason)
VECTORS: list[tuple[str, list[str], str]] = [
    ("analysis-final", ["<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>"
                        "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"], "stop"),
    ("final-only", ["<|channel|>final<|message|>Hello! How can I help?<|return|>"], "stop"),
    ("analysis-call", ["<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant"
                       "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                       '{"city": "San Francisco", "unit": "celsius"}<|call|>'], "stop"),
    ("bare-call", ['<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                   '{"location":"NYC"}<|call|>'], "stop"),
    ("recipient-first", ["<|channel|>analysis<|message|>Check time.<|end|><|start|>assistant to=functions.get_time"
                         '<|channel|>commentary json<|message|>{"tz": "Europe/Paris"}<|call|>'], "stop"),
    ("constrain-no-space", ['<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>'
                            '{"city": "Oslo"}<|call|>'], "stop"),
    ("analysis-channel-call", ["<|channel|>analysis<|message|>Search the codebase first.<|end|><|start|>assistant"
                               '<|channel|>analysis to=functions.grep code<|message|>{"pattern":"parse_config"}'
                               "<|call|>"], "stop"),
    ("preamble-call", ["<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary"
                       "<|message|>Let me check both.<|end|><|start|>assistant<|channel|>commentary "
                       'to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}<|call|>'], "stop"),
    ("several-calls", ["<|channel|>analysis<|message|>Weather, then time.<|end|><|start|>assistant<|channel|>"
                       'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Lima"}<|call|>'
                       "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
                       '{"tz": "America/Lima"}<|call|><|start|>assistant<|channel|>commentary to=functions.grep'
                       ' <|constrain|>json<|message|>{"pattern": "x"}<|call|>'], "stop"),
    ("json-redumped", ["<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                       '{\n  "city" :  "Zürich",\n  "days": [1, 2]\n}<|call|>'], "stop"),
    ("unicode", ["<|channel|>analysis<|message|>Emoji 🙂🙃 and 日本語, ünïcödé.<|end|><|start|>assistant"
                 "<|channel|>final<|message|>Réponse: 東京 👍🏽 — done.<|return|>"], "stop"),
    ("two-analysis", ["<|channel|>analysis<|message|>First thought.<|end|><|start|>assistant<|channel|>analysis"
                      "<|message|>Second thought.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>"],
     "stop"),
    ("literal-markers", ["<|channel|>analysis<|message|>", LIT("Tokens like <|channel|> and <|end|> are markup."),
                         "<|end|><|start|>assistant<|channel|>final<|message|>",
                         LIT("Write <|start|>assistant<|channel|>final<|message|> to answer."), "<|return|>"], "stop"),
    ("final-end", ["<|channel|>final<|message|>Short answer.<|end|>"], "stop"),
    ("cut-analysis", ["<|channel|>analysis<|message|>Thinking about the weather in Par"], "length"),
    ("cut-final", ["<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>"
                   "The answer is 4, because two and"], "length"),
    ("cut-call", ["<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary "
                  'to=functions.get_weather <|constrain|>json<|message|>{"city": "Par'], "length"),
    ("cut-after-call", ["<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                        '{"city": "Bern"}<|call|><|start|>assistant<|channel|>commentary to=functions.get_t'], "length"),
    ("cut-header", ["<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>fin"], "length"),
    ("cut-multibyte", ["<|channel|>final<|message|>Weather: ☀️🌧"], "length"),
]


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    """openai-harmony's gpt-oss encoding, loaded offline from the packaged o200k_base ranks."""
    d = tmp_path_factory.mktemp("tiktoken")
    with gzip.open(_packaged_ranks(), "rb") as f, open(d / "o200k_base.tiktoken", "wb") as g:
        shutil.copyfileobj(f, g)
    old = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(d)
    try:
        yield harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = old


@pytest.fixture(scope="module")
def svc():
    cfg = ServedModelConfig(name=MODEL, tokenizer="o200k_harmony", reasoning_parser="openai_gptoss",
                            tool_parser="openai", enable_auto_tool_choice=True, max_model_len=4096)
    return DerenderService([cfg])


def encode(enc, parts: list[str]) -> list[int]:
    return [t for p in parts for t in (enc.encode(p, disallowed_special=()) if isinstance(p, LIT)
                                       else enc.encode(p, allowed_special="all"))]


def expected(enc, ids: list[int], with_tools: bool) -> tuple[str, str, list]:
    """The reference answer: openai-harmony's messages mapped as the module docstring says."""
    p = harmony.StreamableParser(enc, harmony.Role.ASSISTANT)
    start = 0
    for i, t in enumerate(ids):
        p.process(t)
        if t in enc.stop_tokens():
            start = i + 1
    reasoning, content, calls = "", "", []

    def call_name(recipient):
        r = recipient or ""
        return r[len("functions."):] if r.startswith("functions.") and len(r) > len("functions.") else None

    for m in p.messages:
        text = m.content[0].text if m.content else ""
        name = call_name(m.recipient)
        if name is not None:
            if with_tools:
                calls.append((name, json.loads(text)))
        elif m.channel == "analysis":
            reasoning += text
        else:
            content += text
    if p.state == harmony.StreamState.CONTENT:
        if call_name(p.current_recipient) is not None:
            if with_tools:  # the product's rule: an unterminated call is content, verbatim
                # (less an incomplete last character, as for any text cut by the end of output;
                # no vector holds a real U+FFFD)
                content += enc.decode(ids[start:]).rstrip("\ufffd")
        elif p.current_channel == "analysis":
            reasoning += p.current_content
        else:
            content += p.current_content
    return reasoning, content, calls


def _chat_request(with_tools: bool, stream: bool) -> dict:
    r = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if with_tools:
        r.update(tools=TOOLS, tool_choice="auto")
    return r


def _prompt(enc) -> list[int]:
    return enc.encode("<|start|>user<|message|>hi<|end|><|start|>assistant", allowed_special="all")


def _stop_reason(ids: list[int], finish: str):
    return ids[-1] if finish == "stop" and ids and ids[-1] in (200002, 200012) else None


def nonstream(svc, enc, ids, finish, with_tools):
    body = {"model": MODEL, "chat_request": _chat_request(with_tools, False), "prompt_token_ids": _prompt(enc),
            "generate_response": {"request_id": "r1", "choices": [{"index": 0, "token_ids": ids,
                                                                    "finish_reason": finish,
                                                                    "stop_reason": _stop_reason(ids, finish)}]}}
    res = svc.derender(json.dumps(body).encode())
    out = json.loads(res.body)
    assert not res.is_error, out
    ch = out["choices"][0]
    msg = ch["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
    return (msg.get("reasoning") or "", msg.get("content") or "", calls), ch["finish_reason"]


def chunked(ids: list[int], how: str, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(ids):
        n = {"1": 1, "3": 3}.get(how) or rng.randint(1, 6)
        out.append(ids[i:i + n])
        i += n
    return out or [[]]


def streamed(svc, enc, ids, finish, with_tools, chunks, pieces=False):
    """The streamed answer; ``pieces``: with the stream's append-only pieces kept in memory
    (an open call's body leaves the state: ``worker.core.stream``, "Bounded state")."""
    state = None
    log = bytearray()
    reasoning, content = [], []
    args: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    fin = None
    for k, part in enumerate(chunks):
        last = k == len(chunks) - 1
        ch = {"index": 0, "token_ids": part}
        if last:
            ch.update(finish_reason=finish, stop_reason=_stop_reason(ids, finish))
        body = {"model": MODEL, "stream": True, "generate_chunk": {"request_id": "r1", "choices": [ch]}}
        if k == 0:
            body.update(chat_request=_chat_request(with_tools, True), prompt_token_ids=_prompt(enc))
        raw = json.dumps(body).encode()
        res, new = svc.derender_stream(raw, state, seq=k, pieces=pieces)
        if res.needs_pieces is not None:
            res, new = svc.derender_stream(raw, state, seq=k, pieces=True, reader=lambda a, z: bytes(log[a:z]))
        if pieces and new is not None:
            log[res.pieces_len - len(res.append):] = res.append
        state = new
        out = json.loads(res.body)
        assert not res.is_error, out
        for c in out:
            for choice in c["choices"]:
                d = choice["delta"]
                reasoning.append(d.get("reasoning") or "")
                content.append(d.get("content") or "")
                for tc in d.get("tool_calls") or []:
                    if tc["function"].get("name"):
                        assert tc["index"] not in names
                        names[tc["index"]] = tc["function"]["name"]
                    args.setdefault(tc["index"], []).append(tc["function"].get("arguments") or "")
                fin = choice.get("finish_reason") or fin
    calls = [(names[i], json.loads("".join(args[i]))) for i in sorted(args)]
    return ("".join(reasoning), "".join(content), calls), fin


def test_tokenizer_matches_openai_harmony(svc, enc) -> None:
    rt = svc.runtime(MODEL)
    assert rt.stack.reasoning.reads_ids and rt.stack.tool.reads_ids and rt.stack.wants_stop_token
    tok = rt.tokenizer
    assert tok.vocab_size == 201088
    assert sorted(tok.eos_token_ids) == [199999, 200002, 200012]
    for i, name in HARMONY_SPECIAL_TOKENS.items():
        if not name.startswith("<|reserved_"):
            assert enc.encode(name, allowed_special="all") == [i] and tok.token_to_id(name) == i
    rng = random.Random(7)
    alphabet = "ab cdé日本\n\t{}\"'0123456789ßΩ🙂,.;:!?-_<|>"
    texts = [p for _, parts, _ in VECTORS for p in parts]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    for s in texts:
        ids = enc.encode(s, allowed_special="all")
        assert tok.encode(s) == ids, s
        assert tok.decode(ids, skip_special_tokens=False) == enc.decode(ids)


@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "notools"])
@pytest.mark.parametrize("vid,parts,finish", VECTORS, ids=[v[0] for v in VECTORS])
def test_vector_agrees_with_openai_harmony(svc, enc, vid, parts, finish, with_tools) -> None:
    ids = encode(enc, parts)
    want = expected(enc, ids, with_tools)
    got, fin = nonstream(svc, enc, ids, finish, with_tools)
    assert got == want
    assert fin == ("tool_calls" if want[2] and finish == "stop" else finish)
    for how, seed in (("1", 0), ("3", 0), ("rand", 1), ("rand", 2)):
        s_got, s_fin = streamed(svc, enc, ids, finish, with_tools, chunked(ids, how, seed))
        assert s_got == want, how
        assert s_fin == fin


def test_markers_as_text_keep_the_text_path() -> None:
    """A vocabulary without the Harmony tokens at their o200k_harmony ids (bug-023/117 send the
    markers as text) keeps the text scanner."""
    from worker.core.tokenizer import load_tokenizer
    from worker.parsers import make_reasoning_parser, make_tool_parser
    qwen = load_tokenizer(str(Path(__file__).parent / "data" / "tokenizers" / "qwen3"))
    assert not make_reasoning_parser("openai_gptoss", qwen).reads_ids
    assert not make_tool_parser("openai", qwen).wants_stop_token


# Product rules where openai-harmony raises or vLLM returns a call with broken JSON: the expected
# answers are the rules of worker/parsers/families/gptoss.py (module docstring), not a reference.
RULES = [
    ("broken-json-call", ['<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                          '{"city": Paris}<|call|>'], "stop",
     ("", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": Paris}<|call|>', [])),
    ("no-markup", ["Just plain text, no Harmony at all."], "stop", ("", "Just plain text, no Harmony at all.", [])),
    ("loose-between", ["<|channel|>final<|message|>A<|end|>", LIT("stray"), "<|start|>assistant<|channel|>final"
                       "<|message|>B<|return|>"], "stop", ("", "AstrayB", [])),
    ("empty-channel", ["<|channel|><|message|>x<|end|>"], "stop", ("", "<|channel|><|message|>x<|end|>", [])),
    ("endoftext", ["<|channel|>final<|message|>Hi<|endoftext|>"], "stop", ("", "Hi", [])),
]


@pytest.mark.parametrize("vid,parts,finish,want", RULES, ids=[r[0] for r in RULES])
def test_product_rules_on_real_ids(svc, enc, vid, parts, finish, want) -> None:
    ids = encode(enc, parts)
    got, fin = nonstream(svc, enc, ids, finish, True)
    assert got == want
    for how, seed in (("1", 0), ("3", 0), ("rand", 3)):
        assert streamed(svc, enc, ids, finish, True, chunked(ids, how, seed)) == (got, fin), how


def _random_output(rng: random.Random, enc) -> tuple[list[int], str]:
    """A random gpt-oss output rendered by openai-harmony: 1-5 messages (analysis, preamble,
    call on commentary or analysis, final), random text (multi-byte characters, literal marker
    strings as ordinary text), the last one closed by its stop token, or cut anywhere
    (``length``)."""
    alphabet = list("abc xyz 0123456789,.!?\n\t\"'{}[]éüß日本語🙂👍🏽—") + ["<|channel|>", "<|end|>", " to=functions.x"]

    def text(lo=0, hi=40):
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))

    a = harmony.Role.ASSISTANT
    msgs = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(["analysis", "preamble", "call", "final"])
        if kind == "call":
            args = {"q": text(0, 12), "n": rng.randint(-5, 10 ** 6), "ok": rng.random() < 0.5,
                    "xs": [text(0, 4) for _ in range(rng.randint(0, 3))]}
            body = json.dumps(args, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1, 2]))
            m = harmony.Message.from_role_and_content(a, body).with_channel(rng.choice(["commentary", "analysis"]))
            m = m.with_recipient("functions." + rng.choice(["get_weather", "get_time", "grep"]))
            ctype = rng.choice(["<|constrain|>json", "json", None])
            msgs.append(m.with_content_type(ctype) if ctype else m)
        else:
            channel = {"preamble": "commentary"}.get(kind, kind)
            msgs.append(harmony.Message.from_role_and_content(a, text(1)).with_channel(channel))
    ids: list[int] = []
    for m in msgs:
        ids += enc.render(m)
    head = enc.encode("<|start|>assistant", allowed_special="all")
    assert ids[:len(head)] == head
    ids = ids[len(head):]
    if msgs[-1].channel == "final" and ids[-1] == 200007:
        ids[-1] = 200002  # <|return|> ends the answer
    if rng.random() < 0.4:
        return ids[:rng.randint(1, len(ids) - 1)], "length"
    return ids, "stop"


@pytest.mark.parametrize("seed", range(75))
def test_random_outputs_agree_with_openai_harmony(svc, enc, seed, monkeypatch) -> None:
    """Also with append-only pieces and a spill threshold of a few characters (random chunks):
    every call body spills and comes back."""
    monkeypatch.setattr("worker.core.stream_spill.SPILL_CHARS", 4)
    rng = random.Random(1000 + seed)
    for _ in range(2):
        ids, finish = _random_output(rng, enc)
        for with_tools in (True, False):
            want = expected(enc, ids, with_tools)
            got, fin = nonstream(svc, enc, ids, finish, with_tools)
            assert got == want, (ids, finish)
            for how in ("1", "rand"):
                s_got, s_fin = streamed(svc, enc, ids, finish, with_tools, chunked(ids, how, seed))
                assert (s_got, s_fin) == (got, fin), how
            p_got = streamed(svc, enc, ids, finish, with_tools, chunked(ids, "rand", seed), pieces=True)
            assert p_got == (got, fin), "pieces"


def test_tokenizer_by_name_and_by_folder(tmp_path) -> None:
    """``o200k_harmony`` stays a name in a config file; a folder holding only the ranks file is
    detected as gpt-oss's tokenizer (same cached build: the cache is keyed by the file's hash)."""
    from worker.config import load_config_file
    from worker.core.tokenizer import load_tokenizer
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"gpt-oss": {"tokenizer": "o200k_harmony", "reasoning_parser": "openai_gptoss"}}))
    assert load_config_file(cfg, tokenizer_root=tmp_path)[0].tokenizer == "o200k_harmony"
    d = tmp_path / "gpt-oss"
    d.mkdir()
    shutil.copy(_packaged_ranks(), d / "o200k_base.tiktoken.gz")
    tok = load_tokenizer(str(d))
    assert tok.token_to_id("<|call|>") == 200012 and tok.vocab_size == 201088
    assert tok.decode(tok.encode("<|channel|>final<|message|>Hi"), skip_special_tokens=False) == \
        "<|channel|>final<|message|>Hi"
    (d / "o200k_base.tiktoken.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError):
        load_tokenizer(str(d), "hf")


def test_tiktoken_vocab_command_fails_in_one_line(tmp_path):
    """``python -m worker.core.tiktoken_vocab OUT_DIR RANKS`` with a ranks file that does not exist
    (as without the ``[gptoss]`` extra: no ranks to read) exits 2 with one line naming the cause,
    not a traceback (README's commands table)."""
    import subprocess
    import sys
    repo = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "worker.core.tiktoken_vocab", str(tmp_path / "out"),
                        str(tmp_path / "missing.tiktoken")], cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "missing.tiktoken" in p.stderr and not (tmp_path / "out").exists()
