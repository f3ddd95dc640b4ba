"""``bench stream``'s per-chunk pass (issue 25 item 3): every API's stream runs through the
worker's call of the core and prints one figure per API."""
import json

from worker.bench import stream as bench_stream
from worker.config import ServedModelConfig
from worker.core.responses import memory_reader
from worker.core.service import DerenderService


def _svc() -> DerenderService:
    return DerenderService([ServedModelConfig(name="qwen3", tokenizer=str(bench_stream._DEMO_TOKENIZER),
                                              reasoning_parser="qwen3", tool_parser="hermes",
                                              enable_auto_tool_choice=True)])


def test_worker_path_pass_gives_one_figure_per_api_and_the_replies_of_the_one_value_path(capsys):
    svc = _svc()
    prompt, out = bench_stream.build_output(svc.runtime("qwen3").tokenizer, 200)
    got = bench_stream.worker_path_pass(svc, prompt, out, 1)
    assert sorted(got) == ["chat", "messages", "responses"] and all(v > 0 for v in got.values())
    # the worker's call (pieces, settings apart, kind header, seq) replies as the one-value call
    bodies = bench_stream.stream_bodies(prompt, out, "chat", 0)
    a = b = None
    log = bytearray()
    for i, body in enumerate(bodies):
        ra, a = svc.derender_stream(body, a)
        rb, b = svc.derender_stream(body, b, seq=i, kind="chat-stream", pieces=True, reader=memory_reader(log),
                                    settings_aside=True)
        log[rb.pieces_len - len(rb.append):] = rb.append
        assert ra.body == rb.body and ra.status == rb.status == 200
    assert json.loads(ra.body)[-1]["usage"]["completion_tokens"] == 200
    bench_stream.print_worker_path(svc, prompt, out, 1)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == ["chat", "responses", "messages"]
    assert all("us/chunk" in ln for ln in lines[1:])
