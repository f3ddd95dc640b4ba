"""Which backend serves a tokenizer directory, and the per-``(path, mode)`` cache of loaded
tokenizers (as vLLM's ``vllm/tokenizers/registry.py`` ``get_tokenizer``). Everything is local: no
hub access unless ``path`` is not a directory and looks like a hub id."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from worker.core.tiktoken_vocab import BUILTIN_NAME, harmony_tokenizer_dir, tiktoken_file

from .fast import FastTokenizer
from .mistral import MistralTokenizer, mistral_files
from .protocol import Tokenizer
from .slow import SlowTokenizer

__all__ = ["TOKENIZER_MODES", "load_tokenizer"]

TOKENIZER_MODES = ("auto", "hf", "slow", "mistral", "deepseek_v4")

_CACHE: dict[tuple[str, str], Tokenizer] = {}
_LOCK = threading.Lock()

_HUB_FILES = ["tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
              "special_tokens_map.json", "tokenizer.model", "tokenizer.model.v*", "tekken*.json", "*.tiktoken"]


def _from_hub(repo_id: str) -> Path:
    """Download (or take from the local Hugging Face cache) only the tokenizer files of hub repo
    ``repo_id`` (``org/name``). Raises ``ValueError`` when it is not a hub id or no hub answers."""
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/")):
        raise ValueError(f"tokenizer directory not found: {repo_id}")
    try:
        # deferred: huggingface_hub is loaded only when a tokenizer is fetched from the hub
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
    except Exception as e:  # offline, unknown repo, gated repo...
        raise ValueError(f"tokenizer directory not found: {repo_id}, and it could not be fetched as a "
                         f"hub id ({type(e).__name__}: {e})") from e


def _load_mistral(d: Path, path: str, mode: str) -> MistralTokenizer:
    files = mistral_files(d)
    if not files:
        raise ValueError(f"tokenizer mode 'mistral': no tekken*.json or tokenizer.model.v* in {d}")
    return MistralTokenizer.from_file(files[0], path, mode)


def _load_transformers(d: Path, path: str, mode: str, use_fast: bool) -> Tokenizer:
    """transformers' ``AutoTokenizer`` for ``d``: with ``use_fast`` and a ``tokenizers``
    backend, the fast backend over it; otherwise the slow backend."""
    try:
        # deferred: transformers (seconds to import) is loaded only when no tokenizer.json fast path applies
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(str(d), use_fast=use_fast, local_files_only=True,
                                           trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many types for an unloadable directory
        raise ValueError(f"cannot load tokenizer from {d}: {e}") from e
    inner = getattr(hf, "backend_tokenizer", None)
    if use_fast and inner is not None and hasattr(inner, "decode_batch"):
        return FastTokenizer(inner, d, path, mode)
    return SlowTokenizer(hf, d, path, mode)


def _load(path: str, mode: str) -> Tokenizer:
    d = Path(path)
    if not d.is_dir():
        d = harmony_tokenizer_dir() if path == BUILTIN_NAME else _from_hub(path)
    elif mode != "mistral" and not (d / "tokenizer.json").exists() and tiktoken_file(d) is not None:
        d = harmony_tokenizer_dir(tiktoken_file(d))
    tj = d / "tokenizer.json"
    if mode == "mistral":
        return _load_mistral(d, path, mode)
    if mode == "slow":
        return _load_transformers(d, path, mode, use_fast=False)
    if tj.exists():
        return FastTokenizer.from_file(tj, path, mode)
    if any(d.glob("tokenizer.model*")) or (d / "tokenizer_config.json").exists():
        if not (d / "tokenizer_config.json").exists() and (
                any(d.glob("tokenizer.model.v*")) or any(d.glob("tekken*.json"))):
            return _load_mistral(d, path, mode)
        return _load_transformers(d, path, mode, use_fast=True)
    raise ValueError(f"no tokenizer files (tokenizer.json, tokenizer.model, tekken*.json) in {path}")


def load_tokenizer(path: str, mode: str = "auto") -> Tokenizer:
    """Load (cached per ``(path, mode)``) the tokenizer in directory ``path``, or of hub id
    ``org/name`` (tokenizer files only, through the Hugging Face cache) where a hub is reachable.

    gpt-oss offline (``worker.core.tiktoken_vocab``): ``path`` ``o200k_harmony`` (not a directory)
    is gpt-oss's tokenizer built from the ranks the bpe-openai package ships; a directory with an
    ``o200k_base.tiktoken[.gz]`` and no ``tokenizer.json`` is gpt-oss's tokenizer built from it.

    Modes (vLLM's ``--tokenizer-mode``): ``auto``/``hf``: ``tokenizer.json`` through ``tokenizers``
    (a directory with only a SentencePiece model goes through transformers' ``AutoTokenizer``);
    ``deepseek_v4``: ``tokenizer.json``, decoded as ``auto``; ``mistral``: mistral-common
    (``tekken*.json`` or ``tokenizer.model.v*``); ``slow``: transformers' slow tokenizer.
    Raises ``ValueError`` when the directory cannot be loaded."""
    mode = (mode or "auto").lower()
    if mode not in TOKENIZER_MODES:
        raise ValueError(f"unknown tokenizer mode {mode!r}; expected one of {', '.join(TOKENIZER_MODES)}")
    key = (os.path.abspath(path), mode)
    with _LOCK:
        tok = _CACHE.get(key)
        if tok is None:
            tok = _CACHE[key] = _load(path, mode)
        return tok
