"""Served tokenizers, one backend per module (as vLLM's ``vllm/tokenizers/``):

* ``protocol``: :class:`Tokenizer`, what the derender core reads from a tokenizer, with the
  backend-independent parts (caches, ``decode_single``, the slow detokenizer's defaults);
* ``fast``: :class:`FastTokenizer` over ``tokenizers`` (a ``tokenizer.json``);
* ``slow``: :class:`SlowTokenizer` over transformers' slow tokenizers (``--tokenizer-mode slow``);
* ``mistral``: :class:`MistralTokenizer` over mistral-common (``--tokenizer-mode mistral``);
* ``registry``: :func:`load_tokenizer` (which backend serves a directory; cached per path and mode).

Modules outside this package use only the public members of :class:`Tokenizer` (and
``FastTokenizer.from_fast`` / ``backend_tokenizer`` for in-memory test tokenizers).
"""
from .fast import FastTokenizer
from .mistral import MistralTokenizer
from .protocol import Tokenizer
from .registry import TOKENIZER_MODES, load_tokenizer
from .slow import SlowTokenizer

__all__ = ["Tokenizer", "FastTokenizer", "SlowTokenizer", "MistralTokenizer", "load_tokenizer",
           "TOKENIZER_MODES"]
