"""Compatibility facade: the served tokenizers live in :mod:`worker.core.tokenizers` (one backend
per module); this module re-exports what code and tests imported from here."""
from worker.core.tokenizers import (
    TOKENIZER_MODES,
    FastTokenizer,
    MistralTokenizer,
    SlowTokenizer,
    Tokenizer,
    load_tokenizer,
)

__all__ = ["Tokenizer", "FastTokenizer", "SlowTokenizer", "MistralTokenizer", "load_tokenizer",
           "TOKENIZER_MODES"]
