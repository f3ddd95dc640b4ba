"""``derender-worker run``: the Kafka worker. The flags are ``worker.transport.settings.add_run_args``
plus the model flags; the run loop is ``worker.transport.run.main_run``."""
from __future__ import annotations

import argparse

from worker.config import add_model_args
from worker.flags import add_vllm_noop_args
from worker.transport.run import main_run
from worker.transport.settings import add_run_args

HELP = "consume engine outputs from Kafka, publish OpenAI responses"

__all__ = ["HELP", "add_args", "main"]


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``run``: the model flags (a positional MODEL as ``vllm serve``), the worker's, and
    the vLLM flags accepted without effect."""
    add_model_args(p, positional_model=True)
    add_run_args(p)
    add_vllm_noop_args(p)


def main(args: argparse.Namespace) -> int:
    """Run the worker until SIGTERM/SIGINT; the exit status of ``main_run``."""
    return main_run(args)
