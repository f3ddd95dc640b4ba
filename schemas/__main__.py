"""Regenerate ``schemas/<Type>.schema.json`` for every wire message type (``python -m schemas``).

``--check`` exits 1 (listing the files) when a file on disk differs from what the Structs give.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

from schemas import MESSAGE_TYPES

HERE = Path(__file__).resolve().parent


def render_all() -> dict[str, str]:
    """Map file name -> JSON Schema text (sorted keys, trailing newline) for every message type."""
    out = {}
    for name, typ in MESSAGE_TYPES.items():
        schema = msgspec.json.schema(typ)
        schema["title"] = name
        out[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    ap.add_argument("--out", default=str(HERE), help="directory to write (default: schemas/)")
    ap.add_argument("--verbose", action="store_true", help="say what was written")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    drift = []
    files = render_all()
    for fname, text in files.items():
        path = out_dir / fname
        changed = not path.exists() or path.read_text(encoding="utf-8") != text
        if args.check:
            if changed:
                drift.append(fname)
        elif changed:
            path.write_text(text, encoding="utf-8")
            drift.append(fname)
    if args.verbose and not args.check:
        print(f"{len(files)} JSON Schemas in {out_dir}: {len(drift)} updated"
              + (f" ({', '.join(drift)})" if drift else ""))
    if args.check and drift:
        print("schema drift: " + ", ".join(drift), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
