"""The fast backend: a ``tokenizers.Tokenizer`` (a ``tokenizer.json``; modes ``auto``/``hf``/
``deepseek_v4``, and transformers' fast tokenizers converted from a SentencePiece model).

vLLM 0.32 streams these with ``FastIncrementalDetokenizer`` (tokenizers' ``DecodeStream``), which
decodes with the raw ``tokenizers`` decoder (:meth:`FastTokenizer.raw_decode`), while
``tokenizer.decode`` (logprob token strings) is transformers' ``TokenizersBackend.decode``
(:meth:`FastTokenizer.decode`: the same decode plus ``clean_up_tokenization_spaces`` where
transformers 5 applies it).
"""
from __future__ import annotations

import json
from array import array
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import ClassVar

from tokenizers import Tokenizer as HFTokenizer

from worker.core.tiktoken_vocab import byte_chars

from .protocol import Tokenizer, config_eos_token_ids, tokenizer_config

__all__ = ["FastTokenizer"]

_CHAR_BYTE: dict[str, int] = {c: b for b, c in byte_chars().items()}


def _clean_up_tokenization(text: str) -> str:
    # transformers' PreTrainedTokenizerBase.clean_up_tokenization
    return (
        text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
        .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
        .replace(" 've", "'ve").replace(" 're", "'re")
    )


def _space_marker(fast: HFTokenizer) -> str | None:
    """The Metaspace replacement character of ``fast``'s pre-tokenizer (SentencePiece-style
    vocabularies, ``"▁"``), or None. Reads the pre-tokenizer's own JSON (its pickle state), not
    the whole tokenizer's (``to_str`` + ``json.loads`` of a 150k-token vocabulary took half of a
    tokenizer's load, paid by the main process and every pool process at start)."""
    try:
        pt = fast.pre_tokenizer
        pre = json.loads(pt.__getstate__()) if pt is not None else {}
    except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception for components it cannot serialise: no marker known
        pre = {}
    if not isinstance(pre, dict):
        pre = {}
    subs = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    for sub in subs:
        if isinstance(sub, dict) and sub.get("type") == "Metaspace":
            return sub.get("replacement", "\u2581")
    return None


class _ByteTable(dict):
    """id -> bytes of a byte-level tokenizer's token (``FastTokenizer.token_bytes``), filled on
    first lookup; an id outside ``[0, vocab_size)`` gives ``b""`` and is not stored."""

    __slots__ = ("_fast", "_added", "_vocab_size")

    def __init__(self, fast: HFTokenizer, added: dict[int, str], vocab_size: int):
        super().__init__()
        self._fast, self._added, self._vocab_size = fast, added, vocab_size

    def __missing__(self, i: int) -> bytes:
        if not (isinstance(i, int) and 0 <= i < self._vocab_size):
            return b""
        added = self._added.get(i)
        if added is not None:
            b = added.encode("utf-8")
        else:
            piece = self._fast.id_to_token(i) or ""
            try:
                b = bytes([_CHAR_BYTE[c] for c in piece])
            except KeyError:  # not a byte-level piece: its text
                b = piece.encode("utf-8")
        self[i] = b  # idempotent: concurrent fills write equal values
        return b


#: ``str.translate`` table of the ByteLevel decoder: each byte-level alphabet character to the
#: Latin-1 character of its byte; the other characters below U+0100 to U+FFFF, so that a piece
#: holding any character outside the alphabet fails the Latin-1 encode
_DECODE_TRANSLATE: dict[int, int] = {ord(c): b for c, b in _CHAR_BYTE.items()}
_DECODE_TRANSLATE.update({cp: 0xFFFF for cp in range(256) if cp not in _DECODE_TRANSLATE})
#: array typecode of unsigned 32-bit ints: building one checks every id is in ``[0, 2**32)``
_U32_CODE = next(c for c in "ILH" if array(c).itemsize == 4)


def _byte_level_bytes(piece: str) -> bytes:
    """The bytes tokenizers' ``ByteLevel`` decoder turns one token string into: each character
    through the byte-level alphabet, or, when any character lies outside the alphabet, the
    piece's own UTF-8 bytes (tokenizers ``decoders/byte_level.rs``, ``decode_chain``)."""
    try:
        return piece.translate(_DECODE_TRANSLATE).encode("latin-1")
    except UnicodeEncodeError:
        return piece.encode("utf-8")


class _DecodeTables:
    """The bytes ``tokenizers.Tokenizer.decode`` gives each id on a ``ByteLevel`` decoder, as two
    lists indexed by id, ``keep`` and ``skip`` (``skip_special_tokens``): :func:`_byte_level_bytes`
    of the id's token string (added vocabulary first - what ``id_to_token`` returns), ``b""``
    for an id with no token, and in ``skip`` also ``b""`` for an id whose token STRING is the
    content of a special added token (tokenizers skips by string, not by id). Unlike
    :class:`_ByteTable` (``token_bytes``), an added token goes through the alphabet too
    (``"Ġx"`` decodes to ``" x"``). Entries are ``None`` until first used (:meth:`decode`
    fills them; concurrent fills write equal values)."""

    __slots__ = ("keep", "skip", "size", "_fast", "_specials")

    def __init__(self, fast: HFTokenizer, size: int, specials: frozenset[str]):
        self.keep: list[bytes | None] = [None] * size
        self.skip: list[bytes | None] = [None] * size
        self.size, self._fast, self._specials = size, fast, specials

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """``tokenizers.Tokenizer.decode(ids, skip_special_tokens)`` (``ids``: a sequence of
        ints): the ids' bytes joined, decoded with ``errors="replace"`` (CPython's UTF-8 decoder
        replaces each maximal ill-formed subpart with one U+FFFD, as Rust's
        ``String::from_utf8_lossy`` does). Ids in ``[size, 2**32)`` are skipped; raises
        ``OverflowError`` for an int outside ``[0, 2**32)`` and ``TypeError`` for a non-int, as
        tokenizers does. The gather is C-level (``array`` range check, ``itemgetter``); a
        Python loop runs only when an id is new to the tables or outside them."""
        if type(ids) is not list:
            ids = list(ids)
        table = self.skip if skip_special_tokens else self.keep
        n = len(ids)
        if n == 1:  # (a stream step's common case: one id in the tables, no range-check array)
            i = ids[0]
            if type(i) is int and 0 <= i < self.size:
                b = table[i]
                if b is not None:
                    return b.decode("utf-8", "replace")
        array(_U32_CODE, ids)  # the range check: OverflowError / TypeError, as tokenizers
        try:
            if n > 1:
                return b"".join(itemgetter(*ids)(table)).decode("utf-8", "replace")
            if n:
                return table[ids[0]].decode("utf-8", "replace")
            return ""
        except (TypeError, AttributeError, IndexError):  # an entry not filled yet / an id >= size
            pass
        self.fill(ids)
        size = self.size
        return b"".join([table[i] for i in ids if i < size]).decode("utf-8", "replace")

    def fill(self, ids: list[int]) -> None:
        """Fill the entries of the ids in ``[0, size)`` that are still ``None`` (both lists)."""
        keep, skip, size, specials = self.keep, self.skip, self.size, self._specials
        for i in set(ids):
            if 0 <= i < size and (keep[i] is None or skip[i] is None):
                piece = self._fast.id_to_token(i)
                b = b"" if piece is None else _byte_level_bytes(piece)
                keep[i] = b
                skip[i] = b"" if piece in specials else b


def _decode_tables(fast: HFTokenizer, added: dict, size: int) -> _DecodeTables | None:
    """The :class:`_DecodeTables` of a byte-level ``fast`` (``added``: its
    ``get_added_tokens_decoder()``; ``size``: its vocabulary size), or None when a self-check
    fails: the decode of a sample (every added token alone and all together, a spread of
    vocabulary ids, ids with no token) must equal ``fast.decode`` with special tokens both kept
    and skipped."""
    tables = _DecodeTables(fast, size, frozenset(t.content for t in added.values() if t.special))
    sample = sorted(added) + list(range(0, size, max(1, size // 512))) + [size, size + 1, (1 << 32) - 1]
    cases = [sample, sample[::-1]] + [[i] for i in added]
    try:
        for flag in (False, True):
            for ids in cases:
                if tables.decode(ids, flag) != fast.decode(ids, skip_special_tokens=flag):
                    return None
    except Exception:  # noqa: BLE001 - anything unexpected: keep calling tokenizers
        return None
    return tables


class FastTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` with its directory's configuration (module docstring).
    ``d`` is the directory its ``tokenizer_config.json`` / ``config.json`` /
    ``generation_config.json`` are read from (cleanup flag, EOS ids); a directory without them
    gives no cleanup and no EOS ids."""

    backend: ClassVar[str] = "fast"

    def __init__(self, fast: HFTokenizer, d: Path, path: str, mode: str):
        super().__init__(path, mode)
        self._fast = fast
        added = fast.get_added_tokens_decoder()
        size = fast.get_vocab_size(with_added_tokens=True)
        if added:
            size = max(size, max(added) + 1)
        self.vocab_size = size
        self.added_token_ids = {i: t.content for i, t in added.items()}
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        cleanup = bool(tokenizer_config(d).get("clean_up_tokenization_spaces", False))
        # transformers 5 skips the cleanup for BPE models (it would corrupt their output).
        self._cleanup = cleanup and type(fast.model).__name__ != "BPE"
        try:
            self.is_byte_level = type(fast.decoder).__name__ == "ByteLevel"
        except Exception:  # noqa: BLE001 - a decoder tokenizers cannot describe is not byte-level
            self.is_byte_level = False
        self._space_marker = _space_marker(fast)
        self._tables: _DecodeTables | None = None  # raw_decode's byte tables, byte-level only
        if self.is_byte_level:
            self.token_bytes = _ByteTable(fast, self.added_token_ids, self.vocab_size).__getitem__
            self._tables = _decode_tables(fast, added, size)
            if self._tables is not None:  # one Python frame less per decode (as token_bytes)
                self.raw_decode = self._tables.decode
        #: True when :meth:`raw_decode` (and :meth:`decode`) decode by byte-table lookups instead
        #: of calling ``tokenizers``: a ``ByteLevel`` decoder whose construction self-check passed
        #: (:func:`_decode_tables`); a plain attribute (the stream step reads it per chunk)
        self.decodes_by_table = self._tables is not None
        self.eos_token_ids = config_eos_token_ids(self, d, [])

    @classmethod
    def from_file(cls, tokenizer_json: Path, path: str, mode: str) -> FastTokenizer:
        """Load ``tokenizer_json`` (its directory gives the configuration). Raises ``ValueError``
        when ``tokenizers`` cannot load it."""
        try:
            fast = HFTokenizer.from_file(str(tokenizer_json))
        except Exception as e:  # tokenizers raises its own Exception subclass for any bad file
            raise ValueError(f"cannot load tokenizer {tokenizer_json}: {e}") from e
        return cls(fast, tokenizer_json.parent, path, mode)

    @classmethod
    def from_fast(cls, fast: HFTokenizer, path: str = "<memory>", mode: str = "auto") -> FastTokenizer:
        """Wrap an in-memory ``tokenizers.Tokenizer`` (e.g. a test tokenizer with extra
        added/special tokens) exactly as :func:`~worker.core.tokenizers.load_tokenizer` would from
        its ``tokenizer.json``; ``path`` is only a label (no config files are read, so no EOS ids
        are known). Not cached."""
        return cls(fast, Path(path), path, mode)

    @property
    def backend_tokenizer(self) -> HFTokenizer:
        """The wrapped ``tokenizers.Tokenizer`` (transformers' name for it)."""
        return self._fast

    def piece(self, i: int) -> str:
        """``tokenizers``' ``id_to_token`` (``""`` when it has none)."""
        return self._fast.id_to_token(i) or ""

    def token_to_id(self, token: str) -> int | None:
        """``tokenizers``' ``token_to_id`` (added tokens included)."""
        return self._fast.token_to_id(token)

    def token_bytes(self, i: int) -> bytes | None:
        """The bytes token ``i`` stands for, for byte-level BPE tokenizers (``ByteLevel``
        decoder, e.g. GPT-2 style, Qwen's and gpt-oss's): vocabulary pieces through the byte-level
        alphabet, added tokens as their UTF-8 content, a piece outside the alphabet as its UTF-8
        text; ``b""`` for an id outside the vocabulary. None when the tokenizer is not
        byte-level. On a byte-level tokenizer the constructor replaces this method with the
        C-level lookup of a lazily filled table (:class:`_ByteTable`): one dict lookup per call
        (the logprob U+FFFD repair and the Harmony id scanner call it per token)."""
        return None

    def raw_decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """``tokenizers.Tokenizer.decode`` (no cleanup): what ``DecodeStream`` decodes with.
        Ids in ``[0, 2**32)`` outside the vocabulary are skipped (the incremental detokenizer
        relies on it: stepping skips them too); ``OverflowError`` for an int outside that range.

        On a byte-level tokenizer whose construction self-check passed (:func:`_decode_tables`)
        the same text comes from byte-table lookups, no ``tokenizers`` call
        (:meth:`_DecodeTables.decode`, which the constructor then binds as this instance's
        ``raw_decode``; tests/test_table_decode.py)."""
        tables = self._tables
        if tables is None:
            return self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
        return tables.decode(ids, skip_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """transformers' ``TokenizersBackend.decode``: :meth:`raw_decode` of the in-vocabulary
        ids, then ``clean_up_tokenization_spaces`` where transformers applies it."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            ids = [i for i in ids if 0 <= i < self.vocab_size]
        text = self.raw_decode(ids, skip_special_tokens)
        return _clean_up_tokenization(text) if self._cleanup else text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS); added/special token strings become their ids."""
        return self._fast.encode(text, add_special_tokens=False).ids

    def single_token_text(self, token_id: int) -> str:
        """``decode([token_id])`` with the leading spaces ``decode`` stripped from a
        SentencePiece (Metaspace) piece restored (vLLM's ``convert_ids_list_to_tokens``)."""
        s = self.decode([token_id], skip_special_tokens=False)
        marker = self._space_marker
        if marker is not None:
            raw = self.piece(token_id)
            n = len(raw) - len(raw.lstrip(marker))
            if n:
                missing = n - (len(s) - len(s.lstrip(" ")))
                if missing > 0:
                    s = " " * missing + s
        return s

    def decode_pieces(self, ids: list[int], skip_special_tokens: bool) -> tuple | None:
        """Each id's bytes in the byte tables (:class:`_DecodeTables`, filled first where
        needed): ``b"".join`` of them decoded with ``errors="replace"`` is :meth:`raw_decode`'s
        text. None without tables or for an id outside ``[0, vocab_size)``."""
        tables = self._tables
        if tables is None or (ids and min(ids) < 0):
            return None
        table = tables.skip if skip_special_tokens else tables.keep
        get = itemgetter(*ids) if len(ids) > 1 else lambda t: tuple(t[i] for i in ids)
        try:
            pieces = get(table)
            if None in pieces:  # entries not filled yet
                tables.fill(ids)
                pieces = get(table)
        except IndexError:  # an id >= size
            return None
        return pieces

    def decode_singles(self, ids: list[int]) -> list[str]:
        """:meth:`single_token_text` of each valid id of ``ids``; on a byte-level tokenizer with
        byte tables, no cleanup and no SentencePiece marker, each id's table bytes decoded with
        ``errors="replace"`` (what ``decode([id])`` gives there), C-level after one table fill."""
        tables = self._tables
        if tables is None or self._cleanup or self._space_marker is not None:
            return super().decode_singles(ids)
        tables.fill(ids)
        return list(map(bytes.decode, map(tables.keep.__getitem__, ids), repeat("utf-8"), repeat("replace")))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """transformers' ``TokenizersBackend.convert_tokens_to_string``: the backend decoder."""
        dec = self._fast.decoder
        return dec.decode(tokens) if dec else "".join(tokens)

