"""``python -m worker.bench_batch`` (kept for old command lines) = ``derender-worker bench batch``
(``worker.bench.batch``)."""
import sys

from worker.bench.batch import main

if __name__ == "__main__":
    sys.exit(main())
