"""Served-model configuration: which tokenizer and parsers serve which ``model`` name.

Two ways to configure, mirroring ``vllm serve`` flags:

* one model from flags (``--model DIR`` or ``--tokenizer DIR``, ``--served-model-name NAME
  [ALIAS ...] --reasoning-parser qwen3 --tool-call-parser hermes --enable-auto-tool-choice
  --max-model-len 4096 --max-logprobs 20``);
* several models from ``--config FILE`` (JSON): ``{"<served name>": {"tokenizer": DIR,
  "tokenizer_mode": "auto", "reasoning_parser": null, "tool_parser": null,
  "enable_auto_tool_choice": false, "tool_call_streaming": "whole", "max_model_len": 4096,
  "max_logprobs": 20, "aliases": []}, ...}``; keys
  starting with ``_`` are ignored and relative tokenizer paths are resolved against
  ``--tokenizer-root`` when given, else the file's directory, else the current directory (the
  format of the parity corpus' ``models.json``, whose paths are relative to its parent folder:
  ``--tokenizer-root`` = that parent folder).

Every flag also reads an environment variable ``DERENDER_<FLAG>`` (``DERENDER_TOKENIZER``,
``DERENDER_CONFIG``, ...), flags winning: ``worker.flags.apply_env`` does it for every
subcommand.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

import msgspec

from worker.core.tokenizers import TOKENIZER_MODES

log = logging.getLogger(__name__)

DEFAULT_MAX_N = 16384
DEFAULT_MAX_LOGPROBS = 20


class ServedModelConfig(msgspec.Struct, kw_only=True):
    """How one served model name is derendered.

    ``tokenizer``: local directory (``tokenizer.json``/``tokenizer_config.json``, a SentencePiece
    model, or mistral-common files) or a hub id where a hub is reachable. ``tokenizer_mode``:
    vLLM's names, ``auto``/``hf``, ``mistral`` (mistral-common), ``deepseek_v4``.
    ``custom`` (vLLM's pre-registered tokenizer) loads the directory as ``auto``.
    ``max_model_len``: longest accepted ``token_ids`` (None = tokenizer's model max, else
    unlimited). ``max_logprobs``: most ``top_logprobs`` entries per token (-1 = no limit, as
    vLLM's ``--max-logprobs -1``). ``max_n``: most choices per request (responses x choices for
    completions). ``aliases``: further names served by the same model (vLLM's
    ``--served-model-name A B``); a reply's ``model`` is the name its request used.
    ``tool_call_streaming``: how a streamed chat response carries tool calls: ``whole``
    (default: each call in one delta when its end marker arrives, the stream equals the
    non-streaming answer) or ``incremental`` (the name as soon as it is known, then the
    arguments as they are generated, OpenAI's streaming shape; ``worker.parsers.incremental``).
    Non-streaming responses are the same in both."""

    name: str
    tokenizer: str
    aliases: list[str] = []
    tokenizer_mode: str = "auto"
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    enable_auto_tool_choice: bool = False
    tool_call_streaming: Literal["whole", "incremental"] = "whole"
    max_model_len: int | None = None
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    max_n: int = DEFAULT_MAX_N
    #: logprob token strings as ``token_id:<id>`` (vLLM's ``--return-tokens-as-token-ids``)
    return_tokens_as_token_ids: bool = False


#: ``--tokenizer-mode`` values: the modes ``load_tokenizer`` knows plus vLLM's ``custom`` (vLLM: a
#: tokenizer pre-registered under the ``--tokenizer`` name; there is no plugin registry here, so
#: ``custom`` loads the ``--tokenizer`` directory as ``auto`` does and says so in the log)
TOKENIZER_MODE_CHOICES = (*TOKENIZER_MODES, "custom")


def tokenizer_mode(mode: str | None) -> str:
    """The mode ``load_tokenizer`` gets for a configured ``tokenizer_mode`` (``custom`` -> ``auto``)."""
    mode = (mode or "auto").lower()
    return "auto" if mode == "custom" else mode


_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_int(text: str) -> int:
    """An integer flag value with vLLM's human-readable suffixes: ``1k`` = 1,000, ``1K`` = 1,024
    (``m/M``, ``g/G``, ``t/T`` likewise; decimal suffixes take fractions: ``25.6k`` = 25,600).
    Raises ``ValueError``."""
    s = str(text).strip()
    if s and s[-1] in _SUFFIXES:
        mult = _SUFFIXES[s[-1]]
        num = s[:-1]
        if s[-1].islower():
            return int(float(num) * mult)
        return int(num) * mult
    return int(s)


human_int.__name__ = "int"


def _max_logprobs(text: str) -> int:
    v = int(text)
    if v < -1:
        raise ValueError("must be >= -1 (-1 = no limit)")
    return v


_max_logprobs.__name__ = "int"


def _positive(text: str) -> int:
    v = human_int(text)
    if v < 1:
        raise ValueError("must be >= 1")
    return v


_positive.__name__ = "int"


def add_model_args(ap: argparse.ArgumentParser, positional_model: bool = False) -> None:
    """Add the model/parser flags shared by ``run``, ``batch`` and ``bench`` (vLLM's names; every
    flag also reads ``DERENDER_<FLAG>``, see ``worker.flags``). ``positional_model``: also take
    vLLM's optional positional model tag (``vllm serve MODEL``)."""
    g = ap.add_argument_group("served model (vLLM flag names; or --config for several models)")
    if positional_model:
        g.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                       help="model directory or hub id, as vllm serve MODEL (= --model)")
    g.add_argument("--config", default=None,
                   help="JSON file: served name -> model settings (several models; not vLLM's YAML flag file)")
    g.add_argument("--tokenizer-root", default=None,
                   help="base directory of relative tokenizer paths in --config (default: the file's directory)")
    g.add_argument("--model", default=None,
                   help="model directory or hub id; its tokenizer files are used unless --tokenizer is given")
    g.add_argument("--tokenizer", default=None, help="tokenizer directory or hub id (default: --model)")
    g.add_argument("--tokenizer-mode", default="auto", choices=TOKENIZER_MODE_CHOICES,
                   help="vLLM's modes; custom = load the --tokenizer directory as auto does (no plugin registry)")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="names clients send in 'model' (several = aliases; the reply carries the name used; "
                        "default: --model, else --tokenizer)")
    g.add_argument("--reasoning-parser", default=None)
    g.add_argument("--tool-call-parser", "--tool-parser", dest="tool_parser", default=None)
    g.add_argument("--enable-auto-tool-choice", action="store_true", default=False)
    g.add_argument("--tool-call-streaming", choices=["whole", "incremental"], default="whole",
                   help="streamed tool calls: whole (default) or incremental (name first, then the "
                        "arguments as they are generated)")
    g.add_argument("--max-model-len", type=human_int, default=None,
                   help="longest accepted output in tokens (1k = 1000, 1K = 1024; default: the tokenizer's)")
    g.add_argument("--max-logprobs", type=_max_logprobs, default=DEFAULT_MAX_LOGPROBS,
                   help="most top_logprobs per token (-1 = no limit, as in vLLM)")
    g.add_argument("--max-n", type=_positive, default=DEFAULT_MAX_N, help="most choices per request")
    g.add_argument("--return-tokens-as-token-ids", action=argparse.BooleanOptionalAction, default=False,
                   help="logprob token strings as 'token_id:<id>' (vLLM's flag)")


def load_config_file(path: str | os.PathLike, tokenizer_root: str | os.PathLike | None = None
                     ) -> list[ServedModelConfig]:
    """Read a multi-model JSON config (see module docstring). Relative tokenizer paths resolve
    against ``tokenizer_root`` when given, else the file's directory when the path exists there,
    else stay relative to the current directory; the built-in name ``o200k_harmony`` (gpt-oss's
    tokenizer, ``worker.core.tiktoken_vocab``) stays a name unless such a folder exists there.
    Raises ``ValueError`` on a bad file."""
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        raise ValueError(f"--config {path}: expected a JSON models file (served name -> settings); "
                         "vLLM's YAML flag files are not read, give their flags on the command line")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read model config {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"model config {path}: expected an object of served name -> settings")
    out = []
    for name, entry in raw.items():
        if name.startswith("_"):
            continue
        if not isinstance(entry, dict) or "tokenizer" not in entry:
            raise ValueError(f"model config {path}: entry {name!r} needs a 'tokenizer'")
        entry = dict(entry)
        tok = entry["tokenizer"]
        if not os.path.isabs(tok):
            if tokenizer_root is not None:
                cand = (Path(tokenizer_root) / tok).resolve()
                # the built-in gpt-oss tokenizer name stays a name unless a folder shadows it
                if cand.exists() or tok != "o200k_harmony":
                    entry["tokenizer"] = str(cand)
            elif (p.parent / tok).exists():
                entry["tokenizer"] = str((p.parent / tok).resolve())
        entry.setdefault("tokenizer_mode", "auto")
        for k in ("max_logprobs", "max_n"):
            if entry.get(k) is None:
                entry.pop(k, None)
        try:
            out.append(msgspec.convert({"name": name, **entry}, ServedModelConfig))
        except msgspec.ValidationError as e:
            raise ValueError(f"model config {path}: entry {name!r}: {e}") from e
    if not out:
        raise ValueError(f"model config {path}: no models")
    return out


#: the per-model flags of ``add_model_args`` and their defaults: with ``--config`` they are not
#: read, and one given anyway is named in a warning
MODEL_FLAG_DEFAULTS: dict[str, Any] = {
    "tokenizer": None, "tokenizer_mode": "auto", "reasoning_parser": None, "tool_parser": None,
    "enable_auto_tool_choice": False, "tool_call_streaming": "whole", "max_model_len": None,
    "max_logprobs": DEFAULT_MAX_LOGPROBS, "max_n": DEFAULT_MAX_N, "return_tokens_as_token_ids": False,
}


def models_from_args(args: argparse.Namespace) -> list[ServedModelConfig]:
    """Served models from parsed flags: ``--config`` or the single-model flags (vLLM's rules:
    the tokenizer is ``--tokenizer``, else ``--model`` / the positional model tag; the served
    names are ``--served-model-name`` (first = main, others = aliases), else the model path).
    With ``--config``, per-model flags given too are not read (a warning names them). Raises
    ``ValueError`` when neither names a tokenizer, or on a bad config file."""
    model = getattr(args, "model_tag", None) or getattr(args, "model", None)
    if args.config:
        ignored = [f"--{k.replace('_', '-')} {getattr(args, k)}" for k, d in MODEL_FLAG_DEFAULTS.items()
                   if getattr(args, k, d) != d]
        if ignored or model:
            log.warning("--config %s names the served models: %s ignored (set them per model in the file)",
                        args.config, ", ".join(ignored + ([f"model {model}"] if model else [])))
        models = load_config_file(args.config, getattr(args, "tokenizer_root", None))
        if args.served_model_name:  # pick the served models to use (bench), by any of their names
            want = set(args.served_model_name)
            models = [m for m in models if want & {m.name, *m.aliases}]
            if not models:
                raise ValueError(f"--served-model-name {' '.join(args.served_model_name)}: no such model in "
                                 f"{args.config}")
        return models
    tokenizer = args.tokenizer or model
    if not tokenizer:
        raise ValueError("give --model DIR or --tokenizer DIR (and parser flags), or --config FILE")
    names = list(dict.fromkeys(args.served_model_name or [model or tokenizer]))
    return [ServedModelConfig(
        name=names[0],
        aliases=names[1:],
        tokenizer=tokenizer,
        tokenizer_mode=args.tokenizer_mode,
        reasoning_parser=args.reasoning_parser,
        tool_parser=args.tool_parser,
        enable_auto_tool_choice=bool(args.enable_auto_tool_choice),
        tool_call_streaming=getattr(args, "tool_call_streaming", None) or "whole",
        max_model_len=int(args.max_model_len) if args.max_model_len else None,
        max_logprobs=args.max_logprobs,
        max_n=args.max_n,
        return_tokens_as_token_ids=bool(getattr(args, "return_tokens_as_token_ids", False)),
    )]
