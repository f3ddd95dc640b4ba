"""``derender-worker broker``: the embedded Kafka-protocol broker (Tansu, in memory) alone, for
local runs (the three-terminal quick start of docs/operations.md, "Running")."""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from worker.transport.broker import TansuBroker

HELP = "run the embedded Kafka-protocol broker (Tansu, in memory) for local use"

__all__ = ["HELP", "LIMITS", "add_args", "main"]

#: the startup warning (docs/kafka.md, "Embedded broker limits")
LIMITS = ("warning: for local use only: a restart loses every topic, record and offset, and clients connected "
          "across a restart (or a topic deleted and re-created) can skip or lose acknowledged records; restart "
          "them too (docs/kafka.md, \"Embedded broker limits\")")


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``broker``: the address it listens on, and the host it tells clients to connect to
    (``--advertised-host``: e.g. listen on 0.0.0.0 and advertise ``kafka`` on a compose network)."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9092)
    p.add_argument("--advertised-host", default=None, help="host named to clients in metadata replies (default: --host)")


def main(args: argparse.Namespace) -> int:
    """Run the embedded Tansu broker in the foreground until SIGINT/SIGTERM (in-memory storage,
    topics auto-created on first use). Returns 0, or 2 when it cannot start or exits."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with TansuBroker(port=args.port, host=args.host, advertised_host=args.advertised_host) as broker:
            print(f"Kafka-protocol broker (Tansu, in memory) on {broker.bootstrap_servers}; Ctrl-C stops it",
                  flush=True)
            print(LIMITS, file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                if broker.proc is not None and broker.proc.poll() is not None:
                    print(f"derender-worker broker: Tansu exited with status {broker.proc.returncode}; "
                          f"its log:\n{broker.log_tail()}", file=sys.stderr)
                    return 2
    except (FileNotFoundError, RuntimeError, TimeoutError, OSError) as e:
        print(f"derender-worker broker: cannot start Tansu: {e}", file=sys.stderr)
        return 2
    return 0
