"""Shared test harness modules (imported by test files; never a test file importing another):

* ``cli``: the console entry point as a subprocess, one-line startup error checks;
* ``kafka``: topics, producing, collecting replies, worker settings and bodies for Kafka tests;
* ``parsers``: parser vectors (the family table, tokenizers, split helpers) shared by the parser
  test modules;
* ``streams``: streaming helpers (chunk bodies from a non-streaming case, stream/non-stream views).
"""
