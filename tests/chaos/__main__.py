"""``python -m tests.chaos [--full] [-k NAME ...]``: run chaos scenarios, print one figures line
each (JSON) and a summary; exit 1 when any scenario broke an invariant."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback


def main(argv: list[str] | None = None) -> int:
    from tests.chaos.rolling import ROLLING
    from tests.chaos.scenarios import SCENARIOS
    scenarios = {**SCENARIOS, **ROLLING}
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="full sizes (docs/delivery.md figures) instead of the reduced ones")
    ap.add_argument("-k", action="append", default=[], help="run only scenarios whose name contains this")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the scenarios' cleanup
    size = "full" if args.full else "reduced"
    names = [n for n in scenarios if not args.k or any(k in n for k in args.k)]
    failed = []
    t0 = time.monotonic()
    for name in names:
        t = time.monotonic()
        try:
            figs = scenarios[name](size)
            print(json.dumps({"ok": True, **figs}), flush=True)
        except Exception as e:  # noqa: BLE001 - report every scenario, then fail
            failed.append(name)
            print(json.dumps({"ok": False, "scenario": name, "wall_s": round(time.monotonic() - t, 1),
                              "error": f"{type(e).__name__}: {e}"[:16000]}), flush=True)
            traceback.print_exc()
    print(f"chaos ({size}): {len(names) - len(failed)}/{len(names)} scenarios passed in "
          f"{time.monotonic() - t0:.0f}s" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
