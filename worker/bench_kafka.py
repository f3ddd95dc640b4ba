"""``python -m worker.bench_kafka`` (kept for old command lines) = ``derender-worker bench kafka``
(``worker.bench.kafka``), run through the command line package by module name."""
import runpy
import sys

if __name__ == "__main__":
    sys.argv[1:] = ["bench", "kafka", *sys.argv[1:]]
    runpy.run_module("worker.cli", run_name="__main__", alter_sys=True)
