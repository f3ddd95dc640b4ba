"""The derender as a Ray Data transform (extra: ``pip install 'derender-worker[ray]'``).

From Python, on any Ray cluster (tokenizer paths must exist on every node, or be hub ids)::

    import ray
    from worker.offline.ray_engine import Derender
    ds = ray.data.read_parquet("s3://bucket/rollouts/")          # columns = derender body fields
    out = ds.map_batches(Derender, fn_constructor_kwargs={"config": "models.json"},
                         batch_size=256, batch_format="pyarrow",
                         compute=ray.data.ActorPoolStrategy(size=8))
    out.write_parquet("s3://bucket/derendered/")

``Derender`` builds one ``DerenderService`` per actor (tokenizers loaded once) and maps a batch
of records to the Parquet output columns (``worker.offline.formats.PARQUET_OUTPUT_COLUMNS``):
``index`` (the input's ``index`` column when it has one, else null: add one to join results
back), ``custom_id``, ``status_code``, ``response`` (JSON), ``error`` and the flattened choice-0
columns. Input batches hold either Parquet-style columns named as the derender body's fields
(``model``, ``generate_response``, ``prompt_token_ids``, ``chat_request``, ...; objects as
structs or JSON strings), or a ``text`` column (``ray.data.read_text``) of JSONL lines: derender
bodies, or OpenAI Batch lines with ``input_format="openai-batch"``.

Streams: only whole-request records are accepted. A record that is one stream chunk
(``generate_chunk``) gets a 400 error object (its state would live in whichever actor saw the
previous chunk); a record holding a JSON array of one request's chunk bodies (the parity suite's
``to_requests.py --stream`` format) is derendered whole, in one actor.

The CLI (``derender-worker batch --engine ray [--ray-address ADDR]``) reads the input with Ray
Data (``read_parquet``, or for JSONL ``read_binary_files`` split on ``\n`` into a ``line`` column,
as the local engine splits: each JSONL file is read whole by one task, so shard big logs or use
Parquet, which is read by row group), runs ``Derender`` on ``--workers``
actors with Ray Data's ``preserve_order``, and writes the results in input order through the same
committing writers as the local engine (one output file, atomic rename; the driver streams
``iter_batches``, so its memory is bounded by the batches in flight).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm

from worker.config import ServedModelConfig, load_config_file
from worker.core.service import DerenderService, error_body
from worker.offline import formats
from worker.offline.commit import CommitGuard, SingleFileSink, StdoutSink
from worker.offline.runner import Tally
from worker.offline.streams import stream_list, stream_request_id

STREAM_CHUNK_REFUSED = ("a stream chunk record cannot be derendered by the Ray engine (its stream state "
                        "would live in another actor): give each streamed request as one record holding "
                        "the JSON array of its chunk bodies, or use --engine local")


#: Ray Data block size used by ``run_ray`` (bytes)
BLOCK_BYTES = 8 << 20


class Derender:
    """Ray Data callable class (``Dataset.map_batches(Derender, ...)``): see the module docstring.

    ``config``: a ``models.json`` path (as ``--config``); or ``models``: a list of
    ``ServedModelConfig`` (or dicts of its fields). ``input_format``: ``jsonl`` or
    ``openai-batch`` for a ``text`` column (ignored for field columns). Raises ``ValueError``
    when neither names a model."""

    def __init__(self, config: str | None = None, models: list[Any] | None = None,
                 input_format: str = "jsonl"):
        if config:
            cfgs = load_config_file(config)
        elif models:
            cfgs = [m if isinstance(m, ServedModelConfig) else ServedModelConfig(**m) for m in models]
        else:
            raise ValueError("Derender needs config= (a models.json path) or models=")
        self.service = DerenderService(cfgs)
        self.service.preload()
        self.input_format = input_format

    def _derender(self, item: bytes | tuple[bytes, int]) -> tuple[bytes, int]:
        if isinstance(item, tuple):
            return item
        if not item:
            return error_body("empty input line", 400), 400
        if item[:1] == b"[":
            return stream_list(self.service, item)
        if stream_request_id(item) is not None:
            return error_body(STREAM_CHUNK_REFUSED, 400), 400
        res = self.service.derender(item, formats.kind_of_item(item))  # kind: an OpenAI Batch url (issue 14)
        return res.body, res.status

    def _items(self, table) -> Iterator[tuple[bytes | tuple[bytes, int], str | None]]:
        if "line" in table.column_names and "generate_response" not in table.column_names:
            lines = [x or b"" for x in table.column("line").to_pylist()]  # run_ray's JSONL reader
        elif "text" in table.column_names and "generate_response" not in table.column_names:
            lines = [(x or "").encode() for x in table.column("text").to_pylist()]
        else:
            lines = None
        if lines is not None:
            if self.input_format == "openai-batch":
                yield from formats.read_openai_batch(lines)  # type: ignore[arg-type]
            else:
                yield from ((ln.strip(), None) for ln in lines)
            return
        yield from formats.parquet_rows(table.to_pylist())

    def __call__(self, batch) -> dict[str, list]:
        """A batch (``pyarrow.Table``, or a dict of columns) -> dict of output columns."""
        # deferred: pyarrow (~0.3 s to import) is loaded only for Parquet input/output
        import pyarrow as pa
        table = batch if isinstance(batch, pa.Table) else pa.table(dict(batch))
        idx = table.column("index").to_pylist() if "index" in table.column_names else [None] * table.num_rows
        cols: dict[str, list] = {name: [] for name, _t, _d in formats.PARQUET_OUTPUT_COLUMNS}
        for i, (item, cid) in zip(idx, self._items(table)):
            body, status = self._derender(item)
            for k, v in formats.flat_row(i, body, status, cid).items():  # type: ignore[arg-type]
                cols[k].append(v)
        return cols


def _split_lines(row: dict[str, Any]) -> list[dict[str, bytes]]:
    """One file's bytes (``read_binary_files`` row) -> one ``line`` row per ``\n``-ended line
    (a last line without ``\n`` counts; blank lines are kept, so output N answers line N)."""
    lines = row["bytes"].split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [{"line": ln} for ln in lines]


def _input_paths_format(path: str, input_format: str | None) -> str:
    if input_format:
        return input_format
    first = path
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))
        if not names:
            raise ValueError(f"input folder {path!r} is empty")
        first = os.path.join(path, names[0])
    return formats.detect_input_format(first)


def run_ray(service: DerenderService, input_path: str, output_path: str, *, workers: int = 0,
            batch_size: int = 256, address: str | None = None, progress: bool | None = None,
            input_format: str | None = None, output_format: str | None = None, row_group_rows: int = 4096,
            actor_cpus: float = 1.0, models: list[ServedModelConfig] | None = None,
            guard: CommitGuard | None = None) -> dict[str, Any]:
    """``batch --engine ray``: derender ``input_path`` (a file or a folder of files) on Ray Data
    actors and write ``output_path`` in input order (atomic commit). ``workers``: actors (default:
    this machine's cores on a local Ray, the cluster's CPUs minus one otherwise, leaving room for
    Ray Data's read tasks); ``actor_cpus``: CPUs each actor reserves. ``address``: a Ray cluster
    (default ``RAY_ADDRESS``, else a local Ray started here with one logical CPU more than the
    actors use, stopped at the end). An already initialised Ray (``ray.init`` in the caller) is
    used as it is. Returns the same summary as ``runner.run_batch`` (``seconds`` include the
    actors' start-up: loading the tokenizers) plus ``engine``, ``actors`` and ``startup_s``
    (seconds until the first batch came back). ``guard``: as ``runner.run_batch``'s. Raises
    ``ImportError`` without Ray, ``ValueError``/``OSError`` for bad input or settings."""
    try:
        # deferred: Ray is an optional extra ([ray]), loaded only for --engine ray
        import ray
    except ImportError as e:
        raise ImportError("--engine ray needs Ray Data: pip install 'derender-worker[ray]'") from e
    if input_path == "-":
        raise ValueError("--engine ray reads files, not standard input")
    if not os.path.exists(input_path):
        raise FileNotFoundError(f"input {input_path!r} not found")
    in_fmt = _input_paths_format(input_path, input_format)
    out_fmt = output_format or formats.output_format_for(output_path, in_fmt)
    for f, allowed in ((in_fmt, formats.INPUT_FORMATS), (out_fmt, formats.OUTPUT_FORMATS)):
        if f not in allowed:
            raise ValueError(f"unknown format {f!r} (one of {', '.join(allowed)})")
    cfgs = models if models is not None else list(service.models.values())
    started = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        # a local Ray gets one logical CPU more than the actors use: Ray Data's read tasks need one
        local_cpus = None if address else int(-(-(workers or os.cpu_count() or 1) * actor_cpus // 1)) + 1
        ray.init(address=address, num_cpus=local_cpus, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        started = True
    try:
        return _run(ray, cfgs, input_path, output_path, in_fmt, out_fmt, workers, batch_size, progress,
                    row_group_rows, actor_cpus, guard)
    finally:
        if started:
            ray.shutdown()


def _run(ray, cfgs, input_path, output_path, in_fmt, out_fmt, workers, batch_size, progress,
         row_group_rows, actor_cpus, guard=None) -> dict[str, Any]:
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    # small blocks (Ray's default is 128 MiB): a single input file is split into enough blocks
    # to keep every actor busy, and the driver's ordered buffer stays small
    ctx.target_max_block_size = BLOCK_BYTES
    if in_fmt == "parquet":
        ds = ray.data.read_parquet(input_path)
        total = None
        if os.path.isfile(input_path):
            total = formats.parquet_num_rows(input_path)
    else:
        gzipped = input_path.endswith(".gz")
        if not gzipped and os.path.isfile(input_path):  # as the local engine: by content (RFC 1952 magic)
            with open(input_path, "rb") as fh:
                gzipped = fh.read(2) == formats.GZIP_MAGIC
        args = {"compression": "gzip"} if gzipped else None
        # bytes split on b"\n" only, as the local engine reads: read_text would decode the whole
        # file (one invalid UTF-8 record failed the run) and split on str.splitlines' separators
        # too (a raw U+2028 / U+0085 inside a JSON string made two records of one)
        ds = ray.data.read_binary_files(input_path, arrow_open_stream_args=args).flat_map(_split_lines)
        total = None
    workers = workers or max(1, int(ray.cluster_resources().get("CPU", 2) / actor_cpus) - 1)
    out = ds.map_batches(Derender, fn_constructor_kwargs={"models": cfgs, "input_format": in_fmt},
                         batch_size=batch_size, batch_format="pyarrow",
                         compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=actor_cpus)
    gz = output_path.endswith(".gz") and out_fmt != "parquet"
    sink = StdoutSink(out_fmt, gz, row_group_rows) if output_path == "-" else \
        SingleFileSink(output_path, out_fmt, gz, row_group_rows, guard)
    if progress is None:
        progress = sys.stderr.isatty()
    bar = None
    if progress:
        bar = tqdm(total=total, unit="row", file=sys.stderr, dynamic_ncols=True)
    tally = Tally()
    t0 = time.perf_counter()
    t_first: float | None = None  # first batch back: the actors are up
    n = 0
    try:
        writer = sink.open_part(0)
        for batch in out.iter_batches(batch_size=None, batch_format="pyarrow"):
            if t_first is None:
                t_first = time.perf_counter()
            cid = batch.column("custom_id").to_pylist()
            st = batch.column("status_code").to_pylist()
            resp = batch.column("response").to_pylist()
            for c, s, r in zip(cid, st, resp):
                body = r.encode()
                writer.write(n, body, s, c)
                tally.add(n, body, s)
                n += 1
            if bar is not None:
                bar.update(batch.num_rows)
        sink.finish(1)
    except BaseException as e:
        if guard is not None:
            guard.hold()  # a signal from here on is recorded, not raised: the cleanup completes
        sink.abort(e)
        raise
    finally:
        if bar is not None:
            bar.close()
    t_end = time.perf_counter()
    summary = tally.summary(t_end - t0, n, 0, in_fmt, out_fmt)
    return dict(summary, engine="ray", actors=workers, startup_s=round((t_first or t_end) - t0, 3))


__all__ = ["Derender", "run_ray", "STREAM_CHUNK_REFUSED"]
