"""The tokenizer protocol (``worker.core.tokenizers``): which backend serves a directory, the
facade the rest of the code imported from, and the rule that no module outside the package reads
a backend's private members."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import worker.core.tokenizer as facade
from tests.harness.syntax import parse_all
from worker.core import tokenizers
from worker.core.tokenizers import FastTokenizer, MistralTokenizer, SlowTokenizer, Tokenizer, load_tokenizer

REPO = Path(__file__).resolve().parent.parent
TOKDIR = REPO / "tests" / "data" / "tokenizers"
PACKAGE = REPO / "worker" / "core" / "tokenizers"


def test_the_protocol_is_abstract_and_every_backend_implements_it():
    with pytest.raises(TypeError):
        Tokenizer("x", "auto")  # type: ignore[abstract]
    for cls in (FastTokenizer, SlowTokenizer, MistralTokenizer):
        assert issubclass(cls, Tokenizer) and not cls.__abstractmethods__
    assert {FastTokenizer.backend, SlowTokenizer.backend, MistralTokenizer.backend} == {"fast", "slow"}


def test_the_facade_reexports_the_package():
    for name in ("Tokenizer", "FastTokenizer", "SlowTokenizer", "MistralTokenizer", "load_tokenizer",
                 "TOKENIZER_MODES"):
        assert getattr(facade, name) is getattr(tokenizers, name)


@pytest.mark.parametrize("name,mode,cls", [
    ("qwen3", "auto", FastTokenizer), ("qwen3", "hf", FastTokenizer), ("deepseek-v4", "deepseek_v4", FastTokenizer),
    ("mistral-7b-v0.3", "slow", SlowTokenizer), ("mistral-v7-mistral-mode", "mistral", MistralTokenizer),
    # a tokenizer.model.v* without tokenizer_config.json is mistral-common's, whatever the mode
    ("mistral-v7-mistral-mode", "auto", MistralTokenizer),
])
def test_the_registry_picks_the_backend(name, mode, cls):
    tok = load_tokenizer(str(TOKDIR / name), mode)
    assert type(tok) is cls and tok.mode == mode and tok.path == str(TOKDIR / name)
    assert load_tokenizer(str(TOKDIR / name), mode) is tok


def test_a_sentencepiece_directory_goes_through_transformers_fast(tmp_path):
    """No tokenizer.json but a SentencePiece model and a tokenizer_config.json: transformers
    converts it, and the fast backend serves the converted ``tokenizers`` object."""
    pytest.importorskip("sentencepiece")
    for f in ("tokenizer.model", "tokenizer_config.json", "config.json"):
        shutil.copy(TOKDIR / "mistral-7b-v0.3" / f, tmp_path / f)
    tok = load_tokenizer(str(tmp_path))
    ref = load_tokenizer(str(TOKDIR / "mistral-7b-v0.3"), "hf")
    assert type(tok) is FastTokenizer
    ids = ref.encode("Héllo wörld 你好 🌞 [INST] ok")
    assert tok.decode(ids) == ref.decode(ids) and tok.eos_token_ids == ref.eos_token_ids


def test_bad_directories_and_modes_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer mode"):
        load_tokenizer(str(TOKDIR / "qwen3"), "bogus")
    with pytest.raises(ValueError, match="no tokenizer files"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="no tekken"):
        load_tokenizer(str(tmp_path), "mistral")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        load_tokenizer(str(tmp_path), "hf")


def _private_members() -> set[str]:
    """Private attributes the backend classes set on ``self`` and their private methods."""
    names = set()
    paths = sorted(PACKAGE.glob("*.py"))
    for tree in parse_all(paths):
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            for n in ast.walk(cls):
                if isinstance(n, ast.FunctionDef) and n.name.startswith("_") and not n.name.startswith("__"):
                    names.add(n.name)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                        and n.attr.startswith("_") and not n.attr.startswith("__"):
                    names.add(n.attr)
    return names


def test_no_module_reads_a_backends_private_members():
    names = _private_members()
    assert {"_fast", "_mc", "_hf", "_space_marker"} <= names
    bad = []
    paths = [p for root in ("worker", "schemas", "tests") for p in sorted((REPO / root).rglob("*.py"))
             if PACKAGE not in p.parents and "parity_tools" not in p.parts]
    for p, tree in zip(paths, parse_all(paths), strict=True):
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr in names \
                    and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                bad.append(f"{p.relative_to(REPO)}:{n.lineno}: .{n.attr}")
    assert not bad, "private tokenizer members read outside worker/core/tokenizers:\n" + "\n".join(bad)
