"""The mistral-common backend (``--tokenizer-mode mistral``): a ``tekken*.json`` (Tekkenizer) or
``tokenizer.model.v*`` (SentencePiece) file, decoded as vLLM 0.32's ``MistralTokenizer`` does and
detokenized by vLLM's ``SlowIncrementalDetokenizer`` over that tokenizer's
``convert_ids_to_tokens`` / ``convert_tokens_to_string``.

mistral-common (pydantic models, ~1 s to import) is imported by :meth:`MistralTokenizer.from_file`
and the decode calls only: the module itself imports nothing from it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from .protocol import Tokenizer, config_eos_token_ids

__all__ = ["MistralTokenizer", "mistral_files"]

_REPLACEMENT = "\ufffd"


def mistral_files(d: Path) -> list[Path]:
    """The mistral-common tokenizer files of directory ``d``, preferred first: ``tekken*.json``,
    then ``tokenizer.model.v*``, then a bare ``tokenizer.model``."""
    files = sorted(d.glob("tekken*.json")) + sorted(d.glob("tokenizer.model.v*"))
    if not files and (d / "tokenizer.model").exists():
        files = [d / "tokenizer.model"]
    return files


def _policy(keep: bool) -> Any:
    # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    return SpecialTokenPolicy.KEEP if keep else SpecialTokenPolicy.IGNORE


class MistralTokenizer(Tokenizer):
    """mistral-common's inner tokenizer ``inner`` (``MistralTokenizer.instruct_tokenizer
    .tokenizer``: a ``Tekkenizer`` or ``SentencePieceTokenizer``), ``d`` its directory (EOS ids
    from config files there, plus the tokenizer's own)."""

    backend: ClassVar[str] = "slow"

    def __init__(self, inner: Any, d: Path, path: str, mode: str):
        super().__init__(path, mode)
        # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
        from mistral_common.tokens.tokenizers.base import SpecialTokens
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer
        self._mc = inner
        self._is_tekken = isinstance(inner, Tekkenizer)
        self.vocab_size = inner.n_words
        special = [i for i in range(self.vocab_size) if inner.is_special(i)] if hasattr(inner, "is_special") \
            else list(range(getattr(inner, "num_special_tokens", 0)))
        self.special_ids = frozenset(special)
        keep_ids: set[int] = set()
        keep_tokens: set[str] = set()
        for st in (SpecialTokens.tool_calls, SpecialTokens.args, SpecialTokens.begin_think,
                   SpecialTokens.end_think):
            keep_tokens.add(st.value if hasattr(st, "value") else str(st))
            try:
                if inner.is_special(st):
                    keep_ids.add(inner.get_special_token(st))
            except Exception:  # noqa: BLE001 - mistral-common raises assorted errors for a token this version lacks
                pass
        try:
            keep_ids.add(inner.get_special_token(SpecialTokens.tool_calls))
        except Exception:  # noqa: BLE001 - no [TOOL_CALLS] in this vocabulary: nothing to keep
            pass
        #: control tokens vLLM keeps with skip_special_tokens ([TOOL_CALLS], [ARGS], [THINK], [/THINK])
        self._keep_ids = frozenset(keep_ids)
        self._keep_tokens = frozenset(keep_tokens)
        keep = _policy(True)
        self._special_pieces = frozenset(inner.decode([i], keep) for i in special) if self._is_tekken \
            else frozenset(inner.id_to_piece(i) for i in special)
        self.eos_token_ids = config_eos_token_ids(self, d, [inner.eos_id])

    @classmethod
    def from_file(cls, file: Path, path: str, mode: str) -> MistralTokenizer:
        """Load mistral-common tokenizer ``file`` (see :func:`mistral_files`). Raises
        ``ValueError`` when mistral-common cannot load it."""
        try:
            # deferred: mistral-common (pydantic models, ~1 s to import) is loaded only for --tokenizer-mode mistral
            from mistral_common.tokens.tokenizers.mistral import MistralTokenizer as MCTokenizer
            mt = MCTokenizer.from_file(str(file))
        except Exception as e:  # noqa: BLE001 - mistral-common raises many types for a bad file: all are "cannot load"
            raise ValueError(f"cannot load mistral tokenizer {file}: {e}") from e
        return cls(mt.instruct_tokenizer.tokenizer, file.parent, path, mode)

    @property
    def is_tekken(self) -> bool:
        """The vocabulary is a Tekkenizer (tiktoken-style), not SentencePiece."""
        return self._is_tekken

    def piece(self, i: int) -> str:
        """mistral-common's ``id_to_piece``."""
        return self._mc.id_to_piece(i)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """mistral-common's ``decode`` of the in-vocabulary ids, control tokens ignored
        (``skip_special_tokens``) or kept."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            ids = [i for i in ids if 0 <= i < self.vocab_size]
        return self._mc.decode(ids, special_token_policy=_policy(not skip_special_tokens))

    def encode(self, text: str) -> list[int]:
        """mistral-common's ``encode`` without BOS/EOS (control tokens never come from text)."""
        return list(self._mc.encode(text, bos=False, eos=False))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """vLLM ``MistralTokenizer.convert_tokens_to_string``: SentencePiece: runs of regular
        pieces decoded by the model (special pieces ignored), tool-call/think markers verbatim;
        Tekken: special pieces dropped except those markers, byte pieces decoded through ids."""
        if self._is_tekken:
            return self._tekken_tokens_to_string(tokens)
        keep = self._keep_tokens
        ignore = _policy(False)
        parts: list[str] = []
        run: list[str] = []
        for t in tokens:
            if t in keep:
                if run:
                    parts.append(self._mc.decode(run, ignore))
                    run = []
                parts.append(t)
            else:
                run.append(t)
        if run:
            parts.append(self._mc.decode(run, ignore))
        return "".join(parts)

    def _tekken_tokens_to_string(self, tokens: list[Any]) -> str:
        keep = self._keep_tokens
        tokens = [t for t in tokens if t in keep or t not in self._special_pieces]
        if any(isinstance(t, bytes) for t in tokens):
            ids = [self._tekken_piece_id(t) for t in tokens]
            return self._mc.decode(ids, _policy(True))
        return "".join(tokens)

    def _tekken_piece_id(self, t: str | bytes) -> int:
        # vLLM MistralTokenizer._token_to_id for Tekken: mistral-common keeps these maps private
        tk = self._mc
        b = t.encode("utf-8") if isinstance(t, str) else t
        try:
            return tk.num_special_tokens + tk._tekken_token2id_nospecial[b]
        except KeyError:
            s = b.decode("utf-8", errors="replace")
            return tk._special_tokens_reverse_vocab.get(s, tk.unk_id)

    def incremental_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool) -> list[Any]:
        """vLLM ``MistralTokenizer.convert_ids_to_tokens`` of the in-vocabulary ids (with
        ``skip_special_tokens`` control tokens are dropped except [TOOL_CALLS] and, where they
        exist, [ARGS]/[THINK]/[/THINK]; Tekken pieces holding U+FFFD become byte pieces), then
        one ``""`` per out-of-vocab id."""
        tk = self._mc
        valid = [i for i in ids if 0 <= i < self.vocab_size]
        n_bad = len(ids) - len(valid)
        if not skip_special_tokens:
            return [tk.id_to_piece(i) for i in valid] + [""] * n_bad
        special = self.special_ids
        kept = [i for i in valid if i in self._keep_ids or i not in special]
        toks: list[Any] = [tk.id_to_piece(i) for i in kept]
        if self._is_tekken and any(_REPLACEMENT in t for t in toks):
            keep = _policy(True)
            toks = [tk.id_to_byte_piece(i, keep) if i not in special else tk.decode([i], keep) for i in kept]
        return toks + [""] * n_bad

    def incremental_tokens_to_string(self, tokens: list[str], skip_special_tokens: bool,
                                     spaces_between_special_tokens: bool) -> str:
        """vLLM runs ``convert_tokens_to_string`` for mistral-common (never the added-encoder
        join)."""
        return self.convert_tokens_to_string(tokens)
