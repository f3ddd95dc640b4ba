"""Batch helpers shared by the batch test modules."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from worker.offline import formats


def table_json_columns(bodies: list[dict]) -> pa.Table:
    """One row per body: object fields as JSON string columns, the rest native."""
    keys: list[str] = []
    for b in bodies:
        keys += [k for k in b if k not in keys]
    cols = {}
    for k in keys:
        vals = [b.get(k) for b in bodies]
        if k in formats.OBJECT_FIELDS:
            vals = [None if v is None else json.dumps(v) for v in vals]
        cols[k] = vals
    return pa.table(cols)


#: served-model config of the batch tests (qwen3 + qwen3-noparser: quick to load)
QWEN3 = str(Path(__file__).resolve().parents[2] / "tests" / "data" / "models.json")
