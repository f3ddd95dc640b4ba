"""``python -m worker.bench [SUITE] [flags]`` = ``derender-worker bench [SUITE] [flags]``, run through
the command line package by module name (this library package does not import it)."""
import runpy
import sys

sys.argv[1:] = ["bench", *sys.argv[1:]]
runpy.run_module("worker.cli", run_name="__main__", alter_sys=True)
