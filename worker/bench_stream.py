"""``python -m worker.bench_stream`` (kept for old command lines) = ``derender-worker bench stream``
(``worker.bench.stream``)."""
import sys

from worker.bench.stream import main

if __name__ == "__main__":
    sys.exit(main())
