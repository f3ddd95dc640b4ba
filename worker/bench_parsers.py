"""``python -m worker.bench_parsers`` (kept for old command lines) = ``derender-worker bench parsers``
(``worker.bench.parsers``)."""
import sys

from worker.bench.parsers import main

if __name__ == "__main__":
    sys.exit(main())
