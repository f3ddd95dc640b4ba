"""Served-model configuration: which tokenizer and parsers serve which ``model`` name.

Two ways to configure, mirroring ``vllm serve`` flags:

* one model from flags (``--tokenizer DIR --served-model-name NAME --reasoning-parser qwen3
  --tool-parser hermes --enable-auto-tool-choice --max-model-len 4096 --max-logprobs 20``);
* several models from ``--config FILE`` (JSON): ``{"<served name>": {"tokenizer": DIR,
  "tokenizer_mode": "auto", "reasoning_parser": null, "tool_parser": null,
  "enable_auto_tool_choice": false, "max_model_len": 4096, "max_logprobs": 20}, ...}``; keys
  starting with ``_`` are ignored and relative tokenizer paths are resolved against
  ``--tokenizer-root`` when given, else the file's directory, else the current directory (the
  format of the parity corpus' ``models.json``, whose paths are relative to its parent folder:
  ``--tokenizer-root`` = that parent folder).

Every flag also reads an environment variable ``DERENDER_<FLAG>`` (``DERENDER_TOKENIZER``,
``DERENDER_CONFIG``, ...), flags winning.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import msgspec

DEFAULT_MAX_N = 16384
DEFAULT_MAX_LOGPROBS = 20


class ServedModelConfig(msgspec.Struct, kw_only=True):
    """How one served model name is derendered.

    ``tokenizer``: local directory (``tokenizer.json``/``tokenizer_config.json``, a SentencePiece
    model, or mistral-common files) or a hub id where a hub is reachable. ``tokenizer_mode``:
    vLLM's names, ``auto``/``hf``, ``mistral`` (mistral-common), ``deepseek_v4``.
    ``max_model_len``: longest accepted ``token_ids`` (None = tokenizer's model max, else
    unlimited). ``max_logprobs``: most ``top_logprobs`` entries per token. ``max_n``: most
    choices per request (responses x choices for completions)."""

    name: str
    tokenizer: str
    tokenizer_mode: str = "auto"
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    enable_auto_tool_choice: bool = False
    max_model_len: int | None = None
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    max_n: int = DEFAULT_MAX_N


def _env(name: str, default=None):
    return os.environ.get("DERENDER_" + name.upper().replace("-", "_"), default)


def _env_bool(name: str) -> bool:
    return str(_env(name, "")).lower() in ("1", "true", "yes", "on")


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """Add the model/parser flags shared by ``run``, ``batch`` and ``bench`` (vLLM's names)."""
    g = ap.add_argument_group("served model (vLLM flag names; or --config for several models)")
    g.add_argument("--config", default=_env("config"), help="JSON file: served name -> model settings")
    g.add_argument("--tokenizer-root", default=_env("tokenizer_root"),
                   help="base directory of relative tokenizer paths in --config (default: the file's directory)")
    g.add_argument("--tokenizer", "--model", dest="tokenizer", default=_env("tokenizer"),
                   help="tokenizer directory or hub id")
    g.add_argument("--tokenizer-mode", default=_env("tokenizer_mode", "auto"),
                   choices=["auto", "hf", "slow", "mistral", "deepseek_v4"])
    g.add_argument("--served-model-name", default=_env("served_model_name"),
                   help="model name clients send (default: the tokenizer path)")
    g.add_argument("--reasoning-parser", default=_env("reasoning_parser"))
    g.add_argument("--tool-parser", "--tool-call-parser", dest="tool_parser", default=_env("tool_parser"))
    g.add_argument("--enable-auto-tool-choice", action="store_true", default=_env_bool("enable_auto_tool_choice"))
    g.add_argument("--max-model-len", type=int, default=_env("max_model_len"))
    g.add_argument("--max-logprobs", type=int, default=int(_env("max_logprobs", DEFAULT_MAX_LOGPROBS)))
    g.add_argument("--max-n", type=int, default=int(_env("max_n", DEFAULT_MAX_N)))


def load_config_file(path: str | os.PathLike, tokenizer_root: str | os.PathLike | None = None
                     ) -> list[ServedModelConfig]:
    """Read a multi-model JSON config (see module docstring). Relative tokenizer paths resolve
    against ``tokenizer_root`` when given, else the file's directory when the path exists there,
    else stay relative to the current directory; the built-in name ``o200k_harmony`` (gpt-oss's
    tokenizer, ``worker.core.tiktoken_vocab``) stays a name unless such a folder exists there.
    Raises ``ValueError`` on a bad file."""
    p = Path(path)
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


def models_from_args(args: argparse.Namespace) -> list[ServedModelConfig]:
    """Served models from parsed flags: ``--config`` or the single-model flags.
    Raises ``ValueError`` when neither names a tokenizer."""
    if args.config:
        return load_config_file(args.config, getattr(args, "tokenizer_root", None))
    if not args.tokenizer:
        raise ValueError("give --tokenizer DIR (and parser flags) or --config FILE")
    return [ServedModelConfig(
        name=args.served_model_name or args.tokenizer,
        tokenizer=args.tokenizer,
        tokenizer_mode=args.tokenizer_mode,
        reasoning_parser=args.reasoning_parser,
        tool_parser=args.tool_parser,
        enable_auto_tool_choice=bool(args.enable_auto_tool_choice),
        max_model_len=int(args.max_model_len) if args.max_model_len else None,
        max_logprobs=args.max_logprobs,
        max_n=args.max_n,
    )]
