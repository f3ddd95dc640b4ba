"""The summary of a ``derender-worker batch`` run: the lines printed to standard error (counts,
the distinct failures with their first record, a command listing every failed record) and the
exit status they imply. ``summary`` is the dict returned by ``worker.offline.runner.run_batch``
and ``worker.offline.ray_engine.run_ray``."""
from __future__ import annotations

import shlex

__all__ = ["failed_records_hint", "summary_lines", "exit_status"]


def failed_records_hint(output: str, output_format: str) -> str:
    """A shell command listing the failed records of an output file."""
    q = shlex.quote(output)
    if output_format == "parquet":
        code = ('import sys,pyarrow.parquet as pq,pyarrow.compute as pc; t=pq.read_table(sys.argv[1]); '
                '[print(r) for r in t.filter(pc.not_equal(t["status_code"],200))'
                '.select(["index","status_code","error"]).to_pylist()]')
        return f"python3 -c {shlex.quote(code)} {q}"
    grep = "zgrep" if output.endswith(".gz") else "grep"
    if output_format == "openai-batch":
        return f"{grep} -n -v '\"error\":null}}$' {q}"
    # a refused record is an error object (OpenAI's, or Anthropic's ``{"type":"error","error":{..}}``);
    # a stream list record holds one where a chunk was refused (quotes inside JSON strings are
    # escaped, so response text never matches)
    return f"{grep} -n -E '\\{{\"(type\":\"error\",\")?error\":\\{{' {q}"


def summary_lines(summary: dict, output: str) -> list[str]:
    """The summary printed to standard error: counts, then (when records failed) the distinct
    failures with their first record and a command listing every failed one."""
    errs = sum(summary["errors"].values())
    by = ", ".join(f"{k}: {v}" for k, v in summary["errors"].items())
    head = (f"batch: {summary['lines']} records, {summary['ok']} ok, {errs} failed" + (f" ({by})" if by else "")
            + (f", {summary['skipped']} from completed parts" if summary.get("skipped") else "")
            + f"; {summary['seconds']} s ({summary['lines_per_s']} records/s)"
            + (f", {summary['startup_s']} s of it Ray actors starting" if "startup_s" in summary else ""))
    out = [head]
    if errs:
        where = "index" if summary["output_format"] == "parquet" else "line"
        for f in summary["failures"]:
            first = f["first_index"] + (0 if where == "index" else 1)
            out.append(f"batch:   {f['count']} x {f['status']} {f['message']!r} (first at {where} {first})")
        if any(f["status"] == 404 for f in summary["failures"]):
            out.append("batch: 404 = the record's `model` is not a served name: serve it with --served-model-name "
                       "NAME [ALIAS ...] (default: the --model path, as in vLLM) or a --config entry")
        shown = sum(f["count"] for f in summary["failures"])
        if shown < errs:
            out.append(f"batch:   {errs - shown} more failures of other kinds")
        if output != "-":
            out.append(f"batch: failed records hold an error object (OpenAI's, or Anthropic's for Messages) in {output}; list them: "
                       + failed_records_hint(output, summary["output_format"]))
    return out


def exit_status(summary: dict, fail_on_error: bool) -> int:
    """0, or 1 when no record succeeded in a non-empty input or (``fail_on_error``) any failed."""
    if summary["lines"] and not summary["ok"]:
        return 1
    if fail_on_error and summary["lines"] != summary["ok"]:
        return 1
    return 0
