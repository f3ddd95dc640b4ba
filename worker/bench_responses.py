"""``python -m worker.bench_responses`` (kept for old command lines) = ``derender-worker bench
responses`` (``worker.bench.responses``)."""
import sys

from worker.bench.responses import main

if __name__ == "__main__":
    sys.exit(main())
