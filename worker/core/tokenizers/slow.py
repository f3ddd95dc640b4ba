"""The slow backend: a transformers tokenizer loaded with ``use_fast=False`` (``--tokenizer-mode
slow``), detokenized as vLLM 0.32's ``SlowIncrementalDetokenizer`` does (token strings joined by
the tokenizer's ``convert_tokens_to_string``; with an added vocabulary, vLLM's
``_convert_tokens_to_string_with_added_encoders``).

transformers (seconds to import) is imported by the loader only when this backend is chosen;
this module never imports it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from .protocol import Tokenizer, config_eos_token_ids

__all__ = ["SlowTokenizer"]


class SlowTokenizer(Tokenizer):
    """A loaded transformers tokenizer object ``hf`` (``AutoTokenizer.from_pretrained(d,
    use_fast=False)``), ``d`` its directory (EOS ids from its config files)."""

    backend: ClassVar[str] = "slow"

    def __init__(self, hf: Any, d: Path, path: str, mode: str):
        super().__init__(path, mode)
        self._hf = hf
        self.vocab_size = len(hf)
        self.added_token_ids = {i: t.content for i, t in hf.added_tokens_decoder.items()}
        self.special_ids = frozenset(hf.all_special_ids)
        self._added_contents = frozenset(self.added_token_ids.values())
        self._special_contents = frozenset(hf.all_special_tokens)
        self.eos_token_ids = config_eos_token_ids(
            self, d, [hf.eos_token_id] if isinstance(hf.eos_token_id, int) else [])

    def piece(self, i: int) -> str:
        """transformers' ``convert_ids_to_tokens(i)`` (``""`` when it has none)."""
        return self._hf.convert_ids_to_tokens(i) or ""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """transformers' ``decode`` of the in-vocabulary ids."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            ids = [i for i in ids if 0 <= i < self.vocab_size]
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text: str) -> list[int]:
        """transformers' ``encode`` with no special tokens added."""
        return list(self._hf.encode(text, add_special_tokens=False))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """transformers' ``convert_tokens_to_string``."""
        return self._hf.convert_tokens_to_string(tokens)

    def incremental_tokens_to_string(self, tokens: list[str], skip_special_tokens: bool,
                                     spaces_between_special_tokens: bool) -> str:
        """vLLM's ``_convert_tokens_to_string_with_added_encoders`` when the tokenizer has an
        added vocabulary: special token strings dropped with ``skip_special_tokens``, runs of
        regular tokens joined by ``convert_tokens_to_string``, added tokens kept verbatim, the
        parts joined by ``" "`` when ``spaces_between_special_tokens``; without an added
        vocabulary, plain ``convert_tokens_to_string``."""
        if not self.added_token_ids:
            return self._hf.convert_tokens_to_string(tokens)
        added = self._added_contents
        special = self._special_contents if skip_special_tokens else ()
        parts: list[str] = []
        run: list[str] = []
        for t in tokens:
            if t in special:
                continue
            if t in added:
                if run:
                    parts.append(self._hf.convert_tokens_to_string(run))
                    run = []
                parts.append(t)
            else:
                run.append(t)
        if run:
            parts.append(self._hf.convert_tokens_to_string(run))
        return (" " if spaces_between_special_tokens else "").join(parts)
