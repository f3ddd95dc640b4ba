"""Chaos suite: fault injection against real workers (subprocesses), the embedded broker and
private Redis servers, with invariant checks and printed figures.

``python -m tests.chaos`` runs every scenario at the reduced size (as ``tests/test_chaos.py`` does
in the normal pytest run); ``python -m tests.chaos --full`` at the full size (the figures of
docs/delivery.md); ``-k NAME`` selects scenarios. See ``tests/chaos/scenarios.py``."""
