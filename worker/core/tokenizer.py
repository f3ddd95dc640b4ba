"""Served tokenizers: one small facade over ``tokenizers`` (fast, tokenizer.json), mistral-common
(``--tokenizer-mode mistral``) and transformers' slow tokenizers, exposing what vLLM's detokenizer
and logprob code read from its tokenizer object.

The facade mirrors the two code paths vLLM 0.32 picks per tokenizer:

* ``backend == "fast"`` (modes ``auto``/``hf``/``deepseek_v4`` with a ``tokenizer.json``): vLLM's
  ``FastIncrementalDetokenizer`` (tokenizers' ``DecodeStream``) streams text, decoding with the
  raw ``tokenizers`` decoder (:meth:`Tokenizer.raw_decode`); ``tokenizer.decode`` (logprob token
  strings) is the transformers ``TokenizersBackend.decode`` (:meth:`Tokenizer.decode`).
* ``backend == "slow"`` (``mistral`` mode and ``slow`` mode): vLLM's ``SlowIncrementalDetokenizer``
  (``detokenize_incrementally`` over ``convert_ids_to_tokens``/``convert_tokens_to_string``).

Everything is local: no hub access. Loaded tokenizers are cached per ``(path, mode)``.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from worker.core.tiktoken_vocab import BUILTIN_NAME, byte_chars, harmony_tokenizer_dir, tiktoken_file

__all__ = ["Tokenizer", "load_tokenizer", "TOKENIZER_MODES"]

TOKENIZER_MODES = ("auto", "hf", "slow", "mistral", "deepseek_v4")

_REPLACEMENT = "\ufffd"


def _read_json(p: Path) -> dict[str, Any]:
    try:
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _token_content(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _as_id_list(v: Any) -> list[int]:
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, list):
        return [x for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


def _clean_up_tokenization(text: str) -> str:
    # transformers' PreTrainedTokenizerBase.clean_up_tokenization
    return (
        text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
        .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
        .replace(" 've", "'ve").replace(" 're", "'re")
    )


class Tokenizer:
    """A loaded tokenizer (see module docstring). Read-only after construction; thread-safe."""

    path: str
    mode: str
    backend: str                      # "fast" | "slow"
    vocab_size: int
    eos_token_ids: frozenset[int]
    special_ids: frozenset[int]
    added_token_ids: dict[int, str]   # every added token (special or not) -> its content

    def __init__(self, path: str, mode: str):
        self.path = path
        self.mode = mode
        self._single_cache: dict[int, str] = {}
        #: id -> (logprob token string, its UTF-8 bytes), filled by ``worker.core.logprobs.logprob_rows``
        self.logprob_rows: list | None = None
        #: logprob U+FFFD repair from piece bytes (``worker.core.logprobs._correct_bytes``):
        #: None until decided, then whether this tokenizer is byte-level; id -> piece bytes
        self.logprob_byte_level: bool | None = None
        self.logprob_piece_bytes: dict[int, bytes] = {}
        self._tok_cache: dict[int, str] = {}
        self._fast = None             # tokenizers.Tokenizer
        self._mc = None               # mistral-common inner tokenizer
        self._hf = None               # transformers slow tokenizer
        self._cleanup = False
        self._token_to_id: dict[str, int] | None = None
        self._space_marker: str | None = None
        self._byte_level = False
        self._bytes: list[bytes] | None = None

    # ------------------------------------------------------------------ construction helpers --
    def _finish_eos(self, d: Path, extra: list[int]) -> None:
        eos: set[int] = set(extra)
        tc = _read_json(d / "tokenizer_config.json")
        name = _token_content(tc.get("eos_token"))
        if name is not None:
            i = self.token_to_id(name)
            if i is not None:
                eos.add(i)
        eos.update(_as_id_list(_read_json(d / "config.json").get("eos_token_id")))
        eos.update(_as_id_list(_read_json(d / "generation_config.json").get("eos_token_id")))
        self.eos_token_ids = frozenset(i for i in eos if 0 <= i < self.vocab_size)

    @classmethod
    def from_fast(cls, fast: Any, path: str = "<memory>", mode: str = "auto") -> Tokenizer:
        """Wrap an in-memory ``tokenizers.Tokenizer`` object (e.g. a test tokenizer with extra
        added/special tokens) as a fast-backend facade, exactly as :func:`load_tokenizer` would
        from its ``tokenizer.json``; ``path`` is only a label (no config files are read, so no
        EOS ids are known). Not cached."""
        tok = cls(path, mode)
        _init_from_fast(tok, Path(path), fast)
        return tok

    # ------------------------------------------------------------------------------- queries --
    def is_valid_id(self, i: int) -> bool:
        return 0 <= i < self.vocab_size

    def token_to_id(self, token: str) -> int | None:
        if self._fast is not None:
            return self._fast.token_to_id(token)
        if self._token_to_id is None:
            m: dict[str, int] = {}
            for i in range(self.vocab_size - 1, -1, -1):
                m[self._piece(i)] = i
            self._token_to_id = m
        return self._token_to_id.get(token)

    def _piece(self, i: int) -> str:
        if self._fast is not None:
            return self._fast.id_to_token(i) or ""
        if self._mc is not None:
            return self._mc.id_to_piece(i)
        return self._hf.convert_ids_to_tokens(i) or ""

    def convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
        """Token strings (vocabulary pieces) of ``ids``; out-of-vocab ids give ``""``. With
        ``skip_special_tokens`` the ids in :attr:`special_ids` are dropped (vLLM semantics)."""
        out = []
        cache = self._tok_cache
        for i in ids:
            if skip_special_tokens and i in self.special_ids:
                continue
            s = cache.get(i)
            if s is None:
                s = self._piece(i) if self.is_valid_id(i) else ""
                cache[i] = s
            out.append(s)
        return out

    @property
    def is_byte_level(self) -> bool:
        """The decoder is ``ByteLevel`` (GPT-2 style byte alphabet pieces)."""
        return self._byte_level

    def token_bytes(self, i: int) -> bytes | None:
        """The bytes token ``i`` stands for, for byte-level BPE tokenizers (``ByteLevel`` decoder,
        e.g. GPT-2 style and gpt-oss's): vocabulary pieces through the byte-level alphabet, added
        tokens as their UTF-8 content; ``b""`` for an id outside the vocabulary. None when the
        tokenizer is not byte-level (its tokens have no byte form here). The table is built on
        first use (~0.3 s for 200k ids)."""
        if not self._byte_level:
            return None
        table = self._bytes
        if table is None:
            with _BYTES_LOCK:
                table = self._bytes
                if table is None:
                    table = self._bytes = _byte_table(self)
        return table[i] if 0 <= i < len(table) else b""

    def raw_decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The backend's own decode (``tokenizers.Tokenizer.decode`` for fast tokenizers, no
        cleanup): what ``DecodeStream`` decodes with."""
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """``tokenizer.decode`` as vLLM's served tokenizer does it (transformers / mistral-common
        semantics, incl. ``clean_up_tokenization_spaces`` where transformers applies it).
        Out-of-vocab ids are ignored."""
        ids = [i for i in ids if 0 <= i < self.vocab_size]
        if self._fast is not None:
            text = self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
            return _clean_up_tokenization(text) if self._cleanup else text
        if self._mc is not None:
            # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
            from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
            pol = SpecialTokenPolicy.IGNORE if skip_special_tokens else SpecialTokenPolicy.KEEP
            return self._mc.decode(ids, special_token_policy=pol)
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no BOS/EOS added; added/special token strings in the text
        become their ids (fast tokenizers; mistral-common keeps control tokens out of text).
        Used to build demo, benchmark and test outputs, never on the derender path."""
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        if self._mc is not None:
            return list(self._mc.encode(text, bos=False, eos=False))
        return list(self._hf.encode(text, add_special_tokens=False))

    def decode_single(self, token_id: int) -> str:
        """``tokenizer.decode([token_id])`` (special tokens kept), cached per id: the text vLLM
        gives a logprob entry before U+FFFD repair."""
        s = self._single_cache.get(token_id)
        if s is None:
            s = self.decode([token_id], skip_special_tokens=False) if self.is_valid_id(token_id) else ""
            marker = self._space_marker
            if marker is not None and s is not None and self.is_valid_id(token_id):
                # vLLM convert_ids_list_to_tokens: restore the leading spaces decode() stripped
                # from a SentencePiece (Metaspace) piece
                raw = self._piece(token_id)
                n = len(raw) - len(raw.lstrip(marker))
                if n:
                    missing = n - (len(s) - len(s.lstrip(" ")))
                    if missing > 0:
                        s = " " * missing + s
            if len(self._single_cache) < 1_000_000:
                self._single_cache[token_id] = s
        return s

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Join token strings into text (slow-path detokenization)."""
        if self._mc is not None:
            return self._mc_tokens_to_string(tokens)
        if self._fast is not None:
            # transformers TokenizersBackend.convert_tokens_to_string: backend decoder
            return self._fast.decoder.decode(tokens) if self._fast.decoder else "".join(tokens)
        return self._hf.convert_tokens_to_string(tokens)

    # ----------------------------------------------------------------- mistral-common helpers --
    def _mc_tokens_to_string(self, tokens: list[str]) -> str:
        # vLLM MistralTokenizer.convert_tokens_to_string (SentencePiece branch): runs of regular
        # pieces are decoded by the SPM model (special pieces ignored); tool-call/think markers
        # are kept verbatim.
        # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
        keep = self._mc_keep_tokens
        if self._mc_is_tekken:
            return self._mc_tekken_tokens_to_string(tokens)
        parts: list[str] = []
        run: list[str] = []
        for t in tokens:
            if t in keep:
                if run:
                    parts.append(self._mc.decode(run, SpecialTokenPolicy.IGNORE))
                    run = []
                parts.append(t)
            else:
                run.append(t)
        if run:
            parts.append(self._mc.decode(run, SpecialTokenPolicy.IGNORE))
        return "".join(parts)

    def _mc_tekken_tokens_to_string(self, tokens: list[str]) -> str:
        # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
        keep = self._mc_keep_tokens
        tokens = [t for t in tokens if t in keep or t not in self._mc_special_pieces]
        if any(isinstance(t, bytes) for t in tokens):
            ids = [self._mc_tekken_piece_id(t) for t in tokens]
            return self._mc.decode(ids, SpecialTokenPolicy.KEEP)
        return "".join(tokens)

    def _mc_tekken_piece_id(self, t: str | bytes) -> int:
        tk = self._mc
        b = t.encode("utf-8") if isinstance(t, str) else t
        try:
            return tk.num_special_tokens + tk._tekken_token2id_nospecial[b]
        except KeyError:
            s = b.decode("utf-8", errors="replace")
            return tk._special_tokens_reverse_vocab.get(s, tk.unk_id)

    def mc_convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool) -> list[Any]:
        """vLLM ``MistralTokenizer.convert_ids_to_tokens``: with ``skip_special_tokens`` control
        tokens are dropped except [TOOL_CALLS] (and [ARGS]/[THINK]/[/THINK] where they exist)."""
        tk = self._mc
        if not skip_special_tokens:
            return [tk.id_to_piece(i) for i in ids]
        kept = [i for i in ids if i in self._mc_keep_ids or i not in self.special_ids]
        toks: list[Any] = [tk.id_to_piece(i) for i in kept]
        if self._mc_is_tekken and any(_REPLACEMENT in t for t in toks):
            # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
            from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
            toks = [
                tk.id_to_byte_piece(i, SpecialTokenPolicy.KEEP) if i not in self.special_ids
                else tk.decode([i], SpecialTokenPolicy.KEEP)
                for i in kept
            ]
        return toks

    def __repr__(self) -> str:
        return f"Tokenizer(path={self.path!r}, mode={self.mode!r}, backend={self.backend!r})"


# ------------------------------------------------------------------------------------ loaders --
def _load_fast(tok: Tokenizer, d: Path, tj: Path) -> None:
    try:
        fast = HFTokenizer.from_file(str(tj))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot load tokenizer {tj}: {e}") from e
    _init_from_fast(tok, d, fast)


def _init_from_fast(tok: Tokenizer, d: Path, fast: Any) -> None:
    tok._fast = fast
    tok.backend = "fast"
    added = fast.get_added_tokens_decoder()
    size = fast.get_vocab_size(with_added_tokens=True)
    if added:
        size = max(size, max(added) + 1)
    tok.vocab_size = size
    tok.added_token_ids = {i: t.content for i, t in added.items()}
    tok.special_ids = frozenset(i for i, t in added.items() if t.special)
    tc = _read_json(d / "tokenizer_config.json")
    cleanup = bool(tc.get("clean_up_tokenization_spaces", False))
    # transformers 5 skips the cleanup for BPE models (it would corrupt their output).
    model_type = type(fast.model).__name__
    tok._cleanup = cleanup and model_type != "BPE"
    try:
        pre = json.loads(fast.to_str()).get("pre_tokenizer") or {}
    except Exception:  # noqa: BLE001
        pre = {}
    subs = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    try:
        tok._byte_level = type(fast.decoder).__name__ == "ByteLevel"
    except Exception:  # noqa: BLE001 - a decoder tokenizers cannot describe is not byte-level
        tok._byte_level = False
    for sub in subs:
        if isinstance(sub, dict) and sub.get("type") == "Metaspace":
            tok._space_marker = sub.get("replacement", "\u2581")
            break
    tok._finish_eos(d, [])


def _byte_table(tok: Tokenizer) -> list[bytes]:
    """id -> bytes for a byte-level fast tokenizer (see ``Tokenizer.token_bytes``)."""
    char_byte = {c: b for b, c in byte_chars().items()}
    fast = tok._fast
    out: list[bytes] = []
    for i in range(tok.vocab_size):
        added = tok.added_token_ids.get(i)
        if added is not None:
            out.append(added.encode("utf-8"))
            continue
        piece = fast.id_to_token(i) or ""
        try:
            out.append(bytes(char_byte[c] for c in piece))
        except KeyError:  # not a byte-level piece: its text
            out.append(piece.encode("utf-8"))
    return out


def _load_mistral(tok: Tokenizer, d: Path) -> None:
    files = sorted(d.glob("tekken*.json")) + sorted(d.glob("tokenizer.model.v*"))
    if not files and (d / "tokenizer.model").exists():
        files = [d / "tokenizer.model"]
    if not files:
        raise ValueError(f"tokenizer mode 'mistral': no tekken*.json or tokenizer.model.v* in {d}")
    try:
        # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
        from mistral_common.tokens.tokenizers.base import SpecialTokens
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer
        mt = MistralTokenizer.from_file(str(files[0]))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot load mistral tokenizer {files[0]}: {e}") from e
    inner = mt.instruct_tokenizer.tokenizer
    tok._mc = inner
    tok.backend = "slow"
    tok._mc_is_tekken = isinstance(inner, Tekkenizer)
    tok.vocab_size = inner.n_words
    special = [i for i in range(tok.vocab_size) if inner.is_special(i)] if hasattr(inner, "is_special") \
        else list(range(getattr(inner, "num_special_tokens", 0)))
    tok.special_ids = frozenset(special)
    tok.added_token_ids = {}
    keep_ids: set[int] = set()
    keep_tokens: set[str] = set()
    for st in (SpecialTokens.tool_calls, SpecialTokens.args, SpecialTokens.begin_think, SpecialTokens.end_think):
        keep_tokens.add(st.value if hasattr(st, "value") else str(st))
        try:
            if inner.is_special(st):
                keep_ids.add(inner.get_special_token(st))
        except Exception:  # noqa: BLE001
            pass
    try:
        keep_ids.add(inner.get_special_token(SpecialTokens.tool_calls))
    except Exception:  # noqa: BLE001
        pass
    tok._mc_keep_ids = frozenset(keep_ids)
    tok._mc_keep_tokens = frozenset(keep_tokens)
    tok._mc_special_pieces = frozenset(inner.id_to_piece(i) for i in special) if not tok._mc_is_tekken \
        else frozenset(inner.decode([i], __import__(
            "mistral_common.tokens.tokenizers.base", fromlist=["SpecialTokenPolicy"]).SpecialTokenPolicy.KEEP)
            for i in special)
    tok._finish_eos(d, [inner.eos_id])


def _load_transformers(tok: Tokenizer, d: Path, use_fast: bool) -> None:
    try:
        # deferred: transformers (seconds to import) is loaded only when no tokenizer.json fast path applies
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(str(d), use_fast=use_fast, local_files_only=True,
                                           trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot load tokenizer from {d}: {e}") from e
    inner = getattr(hf, "_tokenizer", None)
    if use_fast and inner is not None and hasattr(inner, "decode_batch"):
        _init_from_fast(tok, d, inner)
        return
    tok._hf = hf
    tok.backend = "slow"
    tok.vocab_size = len(hf)
    added = hf.added_tokens_decoder
    tok.added_token_ids = {i: t.content for i, t in added.items()}
    tok.special_ids = frozenset(hf.all_special_ids)
    tok._finish_eos(d, [hf.eos_token_id] if isinstance(hf.eos_token_id, int) else [])


_CACHE: dict[tuple[str, str], Tokenizer] = {}
_LOCK = threading.Lock()
_BYTES_LOCK = threading.Lock()


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
        if tok is not None:
            return tok
        d = Path(path)
        if not d.is_dir():
            d = harmony_tokenizer_dir() if path == BUILTIN_NAME else _from_hub(path)
        elif mode != "mistral" and not (d / "tokenizer.json").exists() and tiktoken_file(d) is not None:
            d = harmony_tokenizer_dir(tiktoken_file(d))
        tok = Tokenizer(str(path), mode)
        tj = d / "tokenizer.json"
        if mode == "mistral":
            _load_mistral(tok, d)
        elif mode == "slow":
            _load_transformers(tok, d, use_fast=False)
        elif tj.exists():
            _load_fast(tok, d, tj)
        elif any(d.glob("tokenizer.model*")) or (d / "tokenizer_config.json").exists():
            if not (d / "tokenizer_config.json").exists() and (
                    any(d.glob("tokenizer.model.v*")) or any(d.glob("tekken*.json"))):
                _load_mistral(tok, d)
            else:
                _load_transformers(tok, d, use_fast=True)
        else:
            raise ValueError(f"no tokenizer files (tokenizer.json, tokenizer.model, tekken*.json) in {path}")
        _CACHE[key] = tok
        return tok
