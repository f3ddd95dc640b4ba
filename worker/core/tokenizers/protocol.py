"""What the derender core reads from a served tokenizer: the abstract :class:`Tokenizer` every
backend module implements once (as vLLM's ``vllm/tokenizers/protocol.py`` ``TokenizerLike``, with
the shared, backend-independent parts written here instead of in each backend).

Backends (one module each): ``fast`` (``tokenizers``, a ``tokenizer.json``), ``slow``
(transformers' ``AutoTokenizer`` with ``use_fast=False``), ``mistral`` (mistral-common).
:attr:`Tokenizer.backend` names the incremental detokenization algorithm vLLM 0.32 runs for it:
``"fast"`` (``FastIncrementalDetokenizer``, tokenizers' ``DecodeStream`` over :meth:`raw_decode`)
or ``"slow"`` (``SlowIncrementalDetokenizer``, ``detokenize_incrementally`` over
:meth:`incremental_ids_to_tokens` / :meth:`incremental_tokens_to_string`).
"""
from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["Tokenizer", "config_eos_token_ids", "tokenizer_config"]

_SINGLE_CACHE_MAX = 1_000_000


def _read_json(p: Path) -> dict[str, Any]:
    try:
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):  # a missing or unreadable config file adds nothing
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


def tokenizer_config(d: Path) -> dict[str, Any]:
    """``d/tokenizer_config.json`` as a dict (``{}`` when missing or not a JSON object)."""
    return _read_json(d / "tokenizer_config.json")


def config_eos_token_ids(tok: Tokenizer, d: Path, extra: list[int]) -> frozenset[int]:
    """EOS ids of the tokenizer directory ``d`` as vLLM collects them: ``extra`` (the backend's
    own EOS id), ``tokenizer_config.json``'s ``eos_token`` (looked up with ``tok.token_to_id``),
    ``config.json``'s and ``generation_config.json``'s ``eos_token_id`` (an int or a list);
    ids outside ``[0, tok.vocab_size)`` are dropped. Missing files add nothing."""
    eos: set[int] = set(extra)
    name = _token_content(tokenizer_config(d).get("eos_token"))
    if name is not None:
        i = tok.token_to_id(name)
        if i is not None:
            eos.add(i)
    eos.update(_as_id_list(_read_json(d / "config.json").get("eos_token_id")))
    eos.update(_as_id_list(_read_json(d / "generation_config.json").get("eos_token_id")))
    return frozenset(i for i in eos if 0 <= i < tok.vocab_size)


class Tokenizer(abc.ABC):
    """A loaded tokenizer: read-only after construction (its caches fill idempotently, so
    concurrent readers are safe). Backends set, in their constructor: ``vocab_size`` (ids are
    valid in ``[0, vocab_size)``), ``special_ids``, ``added_token_ids`` (every added token,
    special or not -> its content) and ``eos_token_ids``.

    ``logprob_rows`` is the slot of ``worker.core.logprobs``' per-tokenizer table (id -> token
    string, UTF-8 bytes and pre-encoded JSON fragments; None until first used)."""

    #: incremental detokenization algorithm: "fast" (DecodeStream) or "slow" (detokenize_incrementally)
    backend: ClassVar[str]
    #: the decoder is ``ByteLevel`` (GPT-2 style byte alphabet pieces): :meth:`token_bytes` knows
    #: every token's bytes (a backend that can tell sets it per instance)
    is_byte_level: bool = False
    #: ``raw_decode`` is the UTF-8 decode (``errors="replace"``) of the ids' table bytes joined
    #: (the fast backend on a ``ByteLevel`` decoder, ``fast._DecodeTables``)
    decodes_by_table: bool = False
    path: str
    mode: str
    vocab_size: int
    eos_token_ids: frozenset[int]
    special_ids: frozenset[int]
    added_token_ids: dict[int, str]

    def __init__(self, path: str, mode: str):
        self.path = path
        self.mode = mode
        self.vocab_size = 0
        self.eos_token_ids = frozenset()
        self.special_ids = frozenset()
        self.added_token_ids = {}
        self.logprob_rows: object | None = None
        self._single_cache: dict[int, str] = {}
        self._tok_cache: dict[int, str] = {}
        self._token_to_id: dict[str, int] | None = None

    # ------------------------------------------------------------------ backend primitives --
    @abc.abstractmethod
    def piece(self, i: int) -> str:
        """The vocabulary piece (token string) of valid id ``i`` (``""`` if the backend has none)."""

    @abc.abstractmethod
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """``tokenizer.decode`` as vLLM's served tokenizer does it (transformers / mistral-common
        semantics, incl. ``clean_up_tokenization_spaces`` where transformers applies it).
        Out-of-vocab ids are ignored."""

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no BOS/EOS added. Used to build demo, benchmark and test
        outputs, never on the derender path."""

    @abc.abstractmethod
    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Join token strings into text (the backend's ``convert_tokens_to_string``)."""

    # --------------------------------------------------------------------- shared queries --
    def is_valid_id(self, i: int) -> bool:
        """``0 <= i < vocab_size``."""
        return 0 <= i < self.vocab_size

    def token_to_id(self, token: str) -> int | None:
        """Id of vocabulary piece ``token`` (the lowest id when several share it), or None.
        This default builds a piece -> id map over the whole vocabulary on first use."""
        m = self._token_to_id
        if m is None:
            m = {}
            for i in range(self.vocab_size - 1, -1, -1):
                m[self.piece(i)] = i
            self._token_to_id = m
        return m.get(token)

    def convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
        """Token strings (vocabulary pieces) of ``ids``; out-of-vocab ids give ``""``. With
        ``skip_special_tokens`` the ids in :attr:`special_ids` are dropped (vLLM semantics)."""
        out = []
        cache = self._tok_cache
        special = self.special_ids
        for i in ids:
            if skip_special_tokens and i in special:
                continue
            s = cache.get(i)
            if s is None:
                s = self.piece(i) if self.is_valid_id(i) else ""
                cache[i] = s
            out.append(s)
        return out

    def token_bytes(self, i: int) -> bytes | None:
        """The bytes token ``i`` stands for on byte-level tokenizers (see the fast backend);
        None for a tokenizer that is not byte-level (its tokens have no byte form here)."""
        return None

    def raw_decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The decode vLLM's fast incremental detokenizer steps with (the backend's own decode,
        no cleanup); backends without one decode as :meth:`decode`."""
        return self.decode(ids, skip_special_tokens=skip_special_tokens)

    def single_token_text(self, token_id: int) -> str:
        """``decode([token_id])`` with special tokens kept, uncached (``token_id`` valid); the
        fast backend restores SentencePiece leading spaces here (vLLM's
        ``convert_ids_list_to_tokens``)."""
        return self.decode([token_id], skip_special_tokens=False)

    def decode_single(self, token_id: int) -> str:
        """``tokenizer.decode([token_id])`` (special tokens kept), cached per id: the text vLLM
        gives a logprob entry before U+FFFD repair; ``""`` for an out-of-vocab id."""
        s = self._single_cache.get(token_id)
        if s is None:
            s = self.single_token_text(token_id) if self.is_valid_id(token_id) else ""
            if len(self._single_cache) < _SINGLE_CACHE_MAX:
                self._single_cache[token_id] = s
        return s

    def decode_pieces(self, ids: list[int], skip_special_tokens: bool) -> tuple | None:
        """Each id's bytes in the raw decode of ``ids`` (their join decodes, ``errors="replace"``,
        to ``raw_decode(ids, skip_special_tokens)``) where the backend decodes by byte tables
        (``decodes_by_table``); None otherwise or for an id outside the vocabulary."""
        return None

    def decode_singles(self, ids: list[int]) -> list[str]:
        """:meth:`decode_single` of each id of ``ids`` (valid ids), uncached: for filling a
        table of many new ids at once (the logprob rows); backends may do it in bulk."""
        return [self.single_token_text(i) for i in ids]

    # ------------------------------------------------- slow incremental detokenizer parts --
    def incremental_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool) -> list[str]:
        """Token strings ``detokenize_incrementally`` works on for ``ids`` (vLLM's
        ``tokenizer.convert_ids_to_tokens(ids, skip_special_tokens)``): ``""`` for an
        out-of-vocab id, special ids dropped with ``skip_special_tokens``."""
        out = []
        special = self.special_ids
        for i in ids:
            if not self.is_valid_id(i):
                out.append("")
            elif not (skip_special_tokens and i in special):
                out.append(self.convert_ids_to_tokens([i])[0])
        return out

    def incremental_tokens_to_string(self, tokens: list[str], skip_special_tokens: bool,
                                     spaces_between_special_tokens: bool) -> str:
        """Text of a window of :meth:`incremental_ids_to_tokens` strings (vLLM's
        ``detokenize_incrementally`` join); this default is :meth:`convert_tokens_to_string`."""
        return self.convert_tokens_to_string(tokens)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self.path!r}, mode={self.mode!r}, backend={self.backend!r})"
