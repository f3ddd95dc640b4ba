"""Thread races made likely: run ``work(t)`` for ``t`` in ``range(n)`` on ``n`` threads with the
interpreter's switch interval at 1 µs (a thread switch between almost any two bytecodes), so
lazily filled shared tables are raced as a real worker's threads would."""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable

__all__ = ["race"]


def race(work: Callable[[int], None], n: int = 4) -> None:
    """Run ``work(0) .. work(n - 1)`` on ``n`` threads at a 1 µs switch interval; returns when
    all have finished (the switch interval restored). Exceptions inside ``work`` are the caller's
    to record (a thread's exception does not propagate)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
