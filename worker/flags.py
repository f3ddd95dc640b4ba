"""Command-line plumbing shared by every subcommand: environment defaults, one-line errors,
log flags and the vLLM flags this worker accepts without effect.

* **Environment.** Every flag ``--some-flag`` of every subcommand also reads
  ``DERENDER_SOME_FLAG`` (its name upper-cased, ``-`` -> ``_``), a flag on the command line
  winning. A flag with several spellings reads one variable per spelling, plus its ``dest``
  upper-cased (the only name read before: ``--tool-call-parser`` reads ``DERENDER_TOOL_CALL_PARSER``
  and, kept, ``DERENDER_TOOL_PARSER``; ``env_vars``); two of them set to different values is an
  error. A flag may also read a variable of the field after those (``fallback_env``: the
  bootstrap-servers flag of every subcommand reads ``KAFKA_BOOTSTRAP_SERVERS`` when no
  ``DERENDER_`` name of it is set). Subcommands of subcommands (``bench drain``) read theirs too.
  The value is converted and checked like the flag's own (type, choices; booleans take
  ``1/true/yes/on`` or ``0/false/no/off``; list flags split on commas or spaces). A value that
  does not convert is reported only when the flag is not given and the command actually runs
  (``--help`` always works), as one line naming the variable, exit status 2. A ``DERENDER_*``
  variable that no flag of any subcommand reads and that is not in ``RESERVED_ENV`` is one line,
  exit status 2 (``unknown_env``): a misspelt name would otherwise be ignored without a word.
* **Errors.** ``OneLineParser.error`` prints one line, ``<prog>: error: <what> (usage: <prog>
  [options]; <prog> --help lists them)``, exit status 2: the subcommand's usage, never the
  top-level one, and no multi-line usage block in a log pipeline.
* **vLLM flags.** ``vllm serve`` / ``vllm launch render`` flags that configure the GPU engine,
  the HTTP server or prompt rendering mean nothing to a derender worker; ``add_vllm_noop_args``
  accepts them (with their value when they take one) so a command line written for vLLM starts,
  and ``noop_note`` names the ones given in one log line. Any other unknown flag is an error.
"""
from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Mapping

ENV_PREFIX = "DERENDER_"
#: ``DERENDER_*`` variables that are not flags, with who reads them (the "Environment" paragraph
#: of docs/configuration.md lists the same); ``unknown_env`` accepts these besides the flags' variables
RESERVED_ENV = {
    "DERENDER_LOG_LEVEL": "--log-level (flags.log_settings: before or after the subcommand)",
    "DERENDER_LOG_FORMAT": "--log-format (flags.log_settings)",
    "DERENDER_TOKENIZER_CACHE": "where the built o200k_harmony tokenizer is cached (core.tiktoken_vocab)",
    "DERENDER_MAIN_PID": "set by the worker for its pool processes (transport.lifetime)",
    "DERENDER_NO_DOCKER": "tests: never start a Kafka container (transport.broker.bootstrap_for_tests)",
    "DERENDER_MODELS_DIR": "tests: tokenizer folder of the bug cases (tests/parity_tools/run_bugs.py)",
    "DERENDER_TEST_MODELS": "tests: served-model config of the Kafka tests (tests/conftest.py)",
    "DERENDER_BASE_IMAGE": "compose.yaml: the image's base (Dockerfile ARG BASE_IMAGE; ops/compose-test.sh)",
}
#: the field's variable for the Kafka bootstrap servers (read by every ``--bootstrap-servers``
#: after its ``DERENDER_`` names: ``fallback_env``)
KAFKA_BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

log = logging.getLogger("worker.cli")


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line naming the (sub)command's usage,
    exit status 2 (subparsers inherit the class)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        """Print ``<prog>: error: <message> (usage ...)`` on stderr and exit 2."""
        message = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} [options]; "
                     f"{self.prog} --help lists them)\n")

    def _get_value(self, action: argparse.Action, arg_string: str):
        """argparse's conversion, but a bounded type's reason is kept: ``invalid int value: '0'
        (must be >= 1)`` instead of argparse's bare ``invalid int value: '0'``, which reads as if
        0 were not an integer. Plain ``int``/``float`` failures keep argparse's message."""
        type_func = self._registry_get("type", action.type, action.type)
        if callable(type_func) and type_func not in (int, float, str):
            try:
                return type_func(arg_string)
            except (TypeError, ValueError) as e:
                why = str(e)
                if why and not why.startswith(("invalid literal", "could not convert")):
                    name = getattr(type_func, "__name__", "value")
                    raise argparse.ArgumentError(action, f"invalid {name} value: {arg_string!r} ({why})") from None
        return super()._get_value(action, arg_string)


class BadEnv:
    """Default standing for an environment value that did not convert (reported after parsing,
    only when the flag was not given on the command line)."""

    def __init__(self, var: str, raw: str, reason: str):
        self.var, self.raw, self.reason = var, raw, reason

    def __str__(self) -> str:  # shown by --help as the default
        return f"{self.raw} (invalid {self.var})"

    def message(self) -> str:
        """One line: the variable, its value and why it is refused."""
        return f"environment variable {self.var}={self.raw!r}: {self.reason}"


class EnvConflict(BadEnv):
    """Default standing for two spellings of one flag's variable set to different values
    (``given``: ``[(variable, value), ...]``); reported like a ``BadEnv``."""

    def __init__(self, given: list[tuple[str, str]]):
        super().__init__(given[0][0], given[0][1], "")
        self.given = given

    def __str__(self) -> str:
        return f"(conflicting {', '.join(v for v, _ in self.given)})"

    def message(self) -> str:
        """One line naming every variable set and its value."""
        both = " and ".join(f"{v}={raw!r}" for v, raw in self.given)
        return f"environment variables {both} set one flag to different values: keep one of them"


def env_vars(action: argparse.Action) -> list[str]:
    """Environment variables read by a flag, the main one first: ``DERENDER_`` + each long
    spelling upper-cased (``-`` -> ``_``; not the ``--no-`` form of a boolean), then ``DERENDER_``
    + its ``dest`` upper-cased when that differs (the name read before, kept)."""
    names: list[str] = []
    negated = isinstance(action, argparse.BooleanOptionalAction)
    for opt in action.option_strings:
        if not opt.startswith("--") or (negated and opt.startswith("--no-")):
            continue
        name = ENV_PREFIX + opt[2:].replace("-", "_").upper()
        if name not in names:
            names.append(name)
    dest = ENV_PREFIX + action.dest.upper()
    if dest not in names:
        names.append(dest)
    return names


def env_var(action: argparse.Action) -> str:
    """The main environment variable of a flag (its first long spelling; ``env_vars``)."""
    return env_vars(action)[0]


def fallback_env(action: argparse.Action, *names: str) -> argparse.Action:
    """Make ``action`` also read the variables ``names`` (not ``DERENDER_*``; e.g.
    ``KAFKA_BOOTSTRAP_ENV``), in that order, when none of its ``env_vars`` is set; an empty
    value counts as unset. Returns ``action``."""
    action.fallback_env = tuple(names)  # type: ignore[attr-defined]
    return action


def add_bootstrap_servers_arg(ap, default: str | None, help: str) -> argparse.Action:
    """``--bootstrap-servers`` of a subcommand (``ap``: a parser or an argument group): reads
    ``DERENDER_BOOTSTRAP_SERVERS``, then ``KAFKA_BOOTSTRAP_ENV`` (``fallback_env``); the help
    names both. The one definition, so every subcommand reads the same variables."""
    a = ap.add_argument("--bootstrap-servers", default=default, metavar="HOST:PORT[,...]",
                        help=f"{help} (env {ENV_PREFIX}BOOTSTRAP_SERVERS or {KAFKA_BOOTSTRAP_ENV})")
    return fallback_env(a, KAFKA_BOOTSTRAP_ENV)


def nested_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser``'s subcommands' parsers, and theirs, recursively (``bench`` -> ``bench drain``)."""
    out: list[argparse.ArgumentParser] = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in dict.fromkeys(a.choices.values()):  # (aliases map to the same parser)
                out += [sub, *nested_parsers(sub)]
    return out


def _env_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags of ``parser`` that read the environment (not help, subcommands, or flags whose
    action has ``env = False``)."""
    out = []
    for a in parser._actions:
        if not a.option_strings or a.dest in (argparse.SUPPRESS, "help") or getattr(a, "env", True) is False:
            continue
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        out.append(a)
    return out


def known_env(parsers: list[argparse.ArgumentParser]) -> set[str]:
    """Every ``DERENDER_*`` name read by a flag of ``parsers`` (each subcommand's parser) or of
    their ``nested_parsers``, plus ``RESERVED_ENV``."""
    names = set(RESERVED_ENV)
    for p in [q for top in parsers for q in (top, *nested_parsers(top))]:
        for a in _env_actions(p):
            names.update(env_vars(a))
    return names


def unknown_env(known: set[str], environ: Mapping[str, str] | None = None) -> str | None:
    """One line naming the first ``DERENDER_*`` variable of ``environ`` (sorted) that is not in
    ``known`` (with the closest known name when one is close), or None when there is none."""
    environ = os.environ if environ is None else environ
    for var in sorted(v for v in environ if v.startswith(ENV_PREFIX) and v not in known):
        close = difflib.get_close_matches(var, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return (f"environment variable {var} is read by no flag of any subcommand{hint}; "
                f"derender-worker --help and SUBCOMMAND --help list the flags (flag --foo-bar reads "
                f"DERENDER_FOO_BAR); unset it")
    return None


def _convert_one(action: argparse.Action, raw: str):
    value = raw
    if action.type is not None:
        try:
            value = action.type(raw)  # type: ignore[misc]
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            name = getattr(action.type, "__name__", "value")
            why = str(e)
            if not why or why.startswith(("invalid literal", "could not convert")):
                raise ValueError(f"not a valid {name}") from None
            raise ValueError(f"not a valid {name} ({why})") from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"invalid choice (choose from {', '.join(map(str, action.choices))})")
    return value


def env_value(action: argparse.Action, raw: str):
    """Convert environment text ``raw`` as the flag ``action`` would convert its argument.
    Raises ``ValueError`` with the reason."""
    if action.nargs == 0:  # store_true / store_false / BooleanOptionalAction
        low = raw.strip().lower()
        if low not in _TRUE + _FALSE:
            raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE[:-1])}")
        on = low in _TRUE
        if isinstance(action, argparse._StoreFalseAction):
            return not on
        if isinstance(action, argparse._StoreConstAction):
            return action.const if on else action.default
        return on
    if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
        parts = [p for p in raw.replace(",", " ").split() if p]
        if action.nargs == "+" and not parts:
            raise ValueError("expected at least one value")
        return [_convert_one(action, p) for p in parts]
    return _convert_one(action, raw)


def apply_env(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Make each flag of ``parser`` default to its environment variable when set (``env_vars``;
    a value that does not convert becomes a ``BadEnv`` default, two spellings set to different
    values an ``EnvConflict``, both reported by ``check_env``), else to its ``fallback_env``;
    the same for its ``nested_parsers``. Flags whose action has ``env = False`` are skipped, and
    so are flags whose default is ``argparse.SUPPRESS`` (a copy of a parent's flag, which reads
    the variable)."""
    environ = os.environ if environ is None else environ
    for a in [a for p in (parser, *nested_parsers(parser)) for a in _env_actions(p)]:
        if a.default is argparse.SUPPRESS:
            continue
        given = [(var, environ[var]) for var in env_vars(a) if var in environ]
        if not given:
            given = [(var, environ[var]) for var in getattr(a, "fallback_env", ()) if environ.get(var)][:1]
        if not given:
            continue
        var, raw = given[0]
        if len({value for _, value in given}) > 1:
            a.default = EnvConflict(given)
        else:
            try:
                a.default = env_value(a, raw)
            except ValueError as e:
                a.default = BadEnv(var, raw, str(e))
        a.required = False  # a required flag (batch's -o) is given by its variable
        if a.help and a.help is not argparse.SUPPRESS and var not in a.help:
            a.help = f"{a.help} [env {var}]"


def check_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """After parsing: exit 2 with one line (``parser.error``) when a flag not given on the command
    line took a malformed environment value."""
    for value in vars(args).values():
        if isinstance(value, BadEnv):
            parser.error(value.message())


# ------------------------------------------------------------------------------ log flags ----
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
LOG_FORMATS = ("text", "json")


def _level(s: str) -> str:
    s = str(s).strip().upper()
    if s == "WARN":
        s = "WARNING"
    if s not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
    return s


_level.__name__ = "log level"


def add_log_args(ap: argparse.ArgumentParser, top: bool = False) -> None:
    """``--log-level`` and ``--log-format`` (env ``DERENDER_LOG_LEVEL``/``DERENDER_LOG_FORMAT``).
    ``top``: the copy before the subcommand (kept for old command lines; a flag after the
    subcommand wins). Resolved by ``log_settings``."""
    g = ap.add_argument_group("logging")
    prefix = "top_" if top else ""
    a = g.add_argument("--log-level", dest=prefix + "log_level", type=_level, default=None, metavar="LEVEL",
                       help=f"{', '.join(LOG_LEVELS)} (case-insensitive; default INFO; env DERENDER_LOG_LEVEL)")
    a.env = False  # type: ignore[attr-defined]  # resolved in log_settings (flag > top flag > env)
    a = g.add_argument("--log-format", dest=prefix + "log_format", choices=LOG_FORMATS, default=None,
                       help="text (default) or json: one JSON object per line (env DERENDER_LOG_FORMAT)")
    a.env = False  # type: ignore[attr-defined]


def log_settings(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(level, format)`` from the flag after the subcommand, else the one before it, else the
    environment, else ``INFO``/``text``. A malformed environment value exits 2 (one line)."""
    environ = os.environ if environ is None else environ
    level = getattr(args, "log_level", None) or getattr(args, "top_log_level", None)
    if level is None:
        raw = environ.get(ENV_PREFIX + "LOG_LEVEL")
        try:
            level = _level(raw) if raw is not None else "INFO"
        except ValueError as e:
            parser.error(BadEnv(ENV_PREFIX + "LOG_LEVEL", raw or "", str(e)).message())
    fmt = getattr(args, "log_format", None) or getattr(args, "top_log_format", None)
    if fmt is None:
        raw = environ.get(ENV_PREFIX + "LOG_FORMAT")
        fmt = (raw or "text").strip().lower()
        if fmt not in LOG_FORMATS:
            parser.error(BadEnv(ENV_PREFIX + "LOG_FORMAT", raw or "",
                                f"expected one of {', '.join(LOG_FORMATS)}").message())
    return level, fmt


# --------------------------------------------------------------------- vLLM flags, no effect ----
#: ``vllm serve`` / ``vllm launch render`` flags that take a value and mean nothing here
#: (GPU engine, HTTP server, prompt rendering, weights). Source: vLLM's ``FrontendArgs``,
#: ``ModelConfig``/``EngineArgs`` flag names (vllm/entrypoints/openai/cli_args.py,
#: vllm/engine/arg_utils.py).
NOOP_VALUE_FLAGS = (
    "--revision", "--tokenizer-revision", "--code-revision", "--dtype", "--seed", "--hf-token",
    "--hf-config-path", "--hf-overrides", "--download-dir", "--load-format", "--config-format",
    "--chat-template", "--chat-template-content-format", "--default-chat-template-kwargs",
    "--response-role", "--tool-parser-plugin", "--reasoning-parser-plugin", "--tool-server",
    "--generation-config", "--override-generation-config", "--logprobs-mode", "--max-log-len",
    "--lora-modules", "--host", "--port", "--uds", "--api-key", "--root-path", "--middleware",
    "--uvicorn-log-level", "--allowed-origins", "--allowed-methods", "--allowed-headers",
    "--ssl-ca-certs", "--ssl-cert-reqs", "--ssl-ciphers", "--log-config-file",
    "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
    "--api-server-count", "--gpu-memory-utilization", "--kv-cache-dtype", "--quantization",
    "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--swap-space",
    "--cpu-offload-gb", "--limit-mm-per-prompt", "--allowed-local-media-path",
    "--structured-outputs-config", "--compilation-config", "--otlp-traces-endpoint",
    "--collect-detailed-traces", "--fingerprint-mode", "--fingerprint-value",
    "--disable-access-log-for-endpoints", "--distributed-executor-backend", "--max-lora-rank",
    "--max-loras", "--model-impl", "--runner", "--convert", "--task", "--speculative-config",
    "--kv-transfer-config", "--max-seq-len-to-capture", "--rope-scaling", "--rope-theta",
)
#: boolean ``vllm serve`` flags (vLLM also takes ``--no-<flag>``) that mean nothing here
NOOP_BOOL_FLAGS = (
    "--trust-remote-code", "--enable-reasoning", "--enforce-eager", "--skip-tokenizer-init",
    "--disable-log-stats", "--enable-log-requests", "--disable-log-requests", "--enable-log-outputs",
    "--disable-uvicorn-access-log", "--enable-prompt-tokens-details", "--enable-force-include-usage",
    "--enable-server-load-tracking", "--enable-tokenizer-info-endpoint", "--enable-prompt-embeds",
    "--exclude-tools-when-tool-choice-none",
    "--trust-request-chat-template", "--enable-request-id-headers", "--disable-fastapi-docs",
    "--enable-prefix-caching", "--enable-chunked-prefill", "--enable-lora", "--headless",
    "--allow-credentials", "--enable-ssl-refresh", "--log-error-stack", "--enable-log-deltas",
    "--enable-per-request-metrics", "--tokens-only", "--grpc", "--enable-expert-parallel",
)
_NOOP_LIST_FLAGS = ("--lora-modules", "--api-key", "--middleware")  # several values in vLLM
_NOOP_DEST = "noop_vllm_flags"


class _NoopAction(argparse.Action):
    """Record that a no-effect vLLM flag was given (its value is dropped)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = list(getattr(namespace, _NOOP_DEST, None) or [])
        if option_string not in given:
            given.append(option_string)
        setattr(namespace, _NOOP_DEST, given)


def add_vllm_noop_args(ap: argparse.ArgumentParser) -> None:
    """Accept the vLLM flags of ``NOOP_VALUE_FLAGS``/``NOOP_BOOL_FLAGS`` (and ``--no-`` forms of
    the boolean ones) without effect; ``noop_note`` names those given. Call it after the
    subcommand's own flags: a flag the subcommand already defines (it then means something) is
    skipped."""
    taken = set(ap._option_string_actions)
    g = ap.add_argument_group(
        "vLLM flags accepted without effect",
        "vllm serve / vllm launch render flags for the GPU engine, HTTP server and prompt rendering: "
        "accepted so a vLLM command line starts, noted once in the log, otherwise ignored. "
        "--enable-force-include-usage is always on here; reasoning is on with --reasoning-parser.")
    value_flags = [f for f in NOOP_VALUE_FLAGS if f not in taken]
    bool_flags = [f for f in NOOP_BOOL_FLAGS if f not in taken and "--no-" + f[2:] not in taken]
    for flag in value_flags:
        a = g.add_argument(flag, dest=_NOOP_DEST, action=_NoopAction, metavar="X",
                           nargs="*" if flag in _NOOP_LIST_FLAGS else "?",
                           help=argparse.SUPPRESS, default=None)
        a.env = False  # type: ignore[attr-defined]
    for flag in bool_flags:
        a = g.add_argument(flag, "--no-" + flag[2:], dest=_NOOP_DEST, action=_NoopAction, nargs=0,
                           help=argparse.SUPPRESS, default=None)
        a.env = False  # type: ignore[attr-defined]
    g.description = (g.description or "") + " Flags: " + ", ".join(value_flags + bool_flags) + "."


def noop_note(args: argparse.Namespace) -> str | None:
    """The one log line naming the no-effect vLLM flags given, or None."""
    given = getattr(args, _NOOP_DEST, None)
    if not given:
        return None
    return f"vLLM flags accepted without effect in a derender worker: {', '.join(given)}"


def startup_error(prog: str, message: str) -> int:
    """Report a startup error as one line (through logging when it is configured, else stderr)
    and return exit status 2."""
    message = " ".join(str(message).split())
    if logging.getLogger().handlers:
        log.error("%s: %s", prog, message)
    else:
        print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
