"""C-level scans of a token-id list for a few ids of interest (issue 13).

``id_text(ids)`` turns a list of ids into one ``str`` whose code point ``k`` is ``ids[k]``
(``array('I', ids)`` reinterpreted as a 4-byte wide-character array, ``tounicode``: ~10-12 ns
per id plus ~1 us per call, against ~12 ns per id *and per searched id* for ``list.index`` and
~20 ns per id for ``set.isdisjoint``). On it, "the next occurrence of id ``m`` at or after
position ``p``" is ``str.find(chr(m), p)`` (a ``wmemchr``), and "any id of a set?" is one
regular-expression search over a character class built from the set's runs of consecutive ids:
positions are the same as in the id list. Ids in the surrogate range (U+D800-U+DFFF, ordinary
ids of most vocabularies) are kept as lone surrogates, at no extra cost (a UTF-32 decode with
``surrogatepass`` would call its error handler once per such id). Exact: an id the conversion
cannot represent (negative, ``>= 2**32`` or above U+10FFFF, not an int) makes ``id_text``
return None, and the caller scans per id.

The last conversion is remembered by the list's identity (one entry, with the list held so its
identity cannot be reused, and its length checked): the special-id check in
``worker.core.derender._text_of`` and the reasoning count of the same list in
``worker.parsers.think`` share one conversion. The core never mutates an id list once decoded;
a caller that mutates one in place between two scans must not rely on this module.
"""
from __future__ import annotations

import re
import weakref
from array import array, typecodes

#: a 4-byte wide-character typecode (``w``: Py_UCS4, Python >= 3.13; ``u``: wchar_t, 4 bytes
#: on Linux and macOS) and a 4-byte unsigned int one; without both, ``id_text`` is always None
_WIDE = "w" if "w" in typecodes else "u"
_UINT = next((c for c in "IL" if array(c).itemsize == 4), None)
_TEXT_OK = _UINT is not None and array(_WIDE).itemsize == 4

#: id lists up to this long take ``set.isdisjoint`` / ``list.index`` (a stream chunk: the
#: conversion's fixed cost, ~1 us, is more than it saves there; measured break-even ~30 ids)
SMALL = 32

#: special-id sets made of more runs of consecutive ids than this take ``set.isdisjoint``
MAX_RUNS = 16

#: (ids, text): the last conversion (module docstring)
_last: tuple[list[int], str] | None = None

#: tokenizer -> the character class of its special ids (``special_pattern``), or None
_SPECIAL: weakref.WeakKeyDictionary[object, re.Pattern[str] | None] = weakref.WeakKeyDictionary()


def id_text(ids: list[int], keep: bool = True) -> str | None:
    """The ids as one ``str`` (``len`` equal, code point ``k`` = ``ids[k]``), or None when an id
    is not an int in ``[0, 0x110000)``. The last kept result is reused for the same list object
    of the same length (module docstring); ``keep=False`` leaves it in place (a conversion no
    later scan shares, e.g. a prompt's tail)."""
    global _last
    last = _last
    if last is not None and last[0] is ids and len(last[1]) == len(ids):
        return last[1]
    if not _TEXT_OK:
        return None
    try:
        s = array(_WIDE, array(_UINT, ids).tobytes()).tounicode()
    except (OverflowError, TypeError, ValueError):  # negative, >= 2**32, not an int; > U+10FFFF
        return None
    if keep:
        _last = (ids, s)
    return s


def runs_pattern(ids) -> re.Pattern[str] | None:
    """A compiled regular expression matching one character whose code point is in ``ids``
    (a character class of their runs of consecutive ids), or None when ``ids`` is empty or has
    more than ``MAX_RUNS`` runs (a long class costs a per-id scan of its own)."""
    s = sorted(set(ids))
    if not s or s[0] < 0 or s[-1] >= 0x110000:
        return None
    runs: list[tuple[int, int]] = []
    for i in s:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    if len(runs) > MAX_RUNS:
        return None
    cls = "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in runs)
    return re.compile(f"[{cls}]")


def special_pattern(tok) -> re.Pattern[str] | None:
    """``runs_pattern(tok.special_ids)``, built once per tokenizer (cached weakly on it)."""
    try:
        return _SPECIAL[tok]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable / not hashable
        return None
    p = runs_pattern(getattr(tok, "special_ids", ()))
    _SPECIAL[tok] = p
    return p


def has_special(tok, ids: list[int]) -> bool:
    """Whether ``ids`` holds a special id of ``tok`` (``tok.special_ids``): for lists longer
    than ``SMALL``, one search of ``special_pattern`` over ``id_text(ids)``; otherwise (or when
    either is None) ``set.isdisjoint``. Same answer either way."""
    if len(ids) > SMALL:
        p = special_pattern(tok)
        if p is not None:
            s = id_text(ids)
            if s is not None:
                return p.search(s) is not None
    return not tok.special_ids.isdisjoint(ids)
