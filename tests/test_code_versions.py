"""Code versions are derived from the code (tasks/code_versions.py): a stage's version covers every lexiflow
module its builder reaches, imports followed transitively, function-level imports and tables of
classes included; comments and docstrings do not count; a stage serving several kinds versions each
kind with its own code."""

import importlib
import pkgutil
import textwrap

from lexiflow import tasks
from lexiflow.tasks.code_versions import code_modules, source_hash


def stages():
    for info in pkgutil.iter_modules(tasks.__path__):
        module = importlib.import_module(f"lexiflow.tasks.{info.name}")
        for obj in vars(module).values():
            if hasattr(obj, "code_modules") and obj.fn.__module__ == module.__name__:
                yield obj


def short(names):
    return {n.removeprefix("lexiflow.") for n in names}


def test_every_stage_is_derived_and_covers_its_own_module_and_the_store_formats():
    found = list(stages())
    assert len(found) >= 14, len(found)
    for stage in found:
        modules = short(stage.code_modules({}))
        assert stage.fn.__module__.removeprefix("lexiflow.") in modules
        assert "storage.formats" in modules, stage.name


def test_imports_are_followed_transitively_through_models():
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.vocabulary import learn_subword

    # models.text and models.conllu are reached only through models.ingest's imports
    assert {"models.ingest", "models.text", "models.conllu", "tasks.parallel"} <= short(ingest_corpus.code_modules({}))
    # BPE/WordPiece are reached through a module-level table (SUBWORD) and a package re-export
    assert {"models.tokenizers.bpe", "models.tokenizers.wordpiece", "models.tokenizers.base"} <= short(
        learn_subword.code_modules({}))


def test_modules_that_cannot_change_an_artifact_are_not_versioned():
    from lexiflow.tasks.matrices import compute_ppmi

    modules = short(compute_ppmi.code_modules({}))
    assert modules == {"tasks.matrices", "models.ppmi", "models.lsi", "storage.formats"}, modules  # lsi: X·Xᵀ


def test_each_lm_kind_is_versioned_with_its_own_code():
    from lexiflow.tasks.lm import train_lm

    ngram = short(train_lm.code_modules({"model": "ngram"}))
    transformer = short(train_lm.code_modules({"model": "transformer"}))
    assert "models.lm.ngram" in ngram and not {"models.lm.transformer", "models.lm.train"} & ngram
    assert {"models.lm.transformer", "models.lm.train", "models.lm.neural"} <= transformer
    assert not {"models.lm.ngram", "models.lm.rnn", "models.lm.ffnn"} & transformer


def test_comments_and_docstrings_do_not_change_the_hash_code_does():
    code = textwrap.dedent('''
        """Module docstring."""
        def f(x):
            """Docstring."""
            return x + 1  # a comment
        ''')
    edited = code.replace("Docstring.", "Another docstring.").replace("a comment", "another comment")
    assert source_hash(code) == source_hash(edited)
    assert source_hash(code) != source_hash(code.replace("x + 1", "x + 2"))
    assert source_hash(code) != source_hash(code.replace('"""Docstring."""', 'print("side effect")'))


def test_a_derived_closure_is_the_same_whatever_the_call_order():
    from lexiflow.models.lm.registry import KINDS
    from lexiflow.tasks.lm import train_lm

    build = train_lm.fn.__wrapped__
    assert code_modules(build, KINDS["gru"], KINDS.values()) == code_modules(build, KINDS["lstm"], KINDS.values())


def _forget(code_versions):
    for cached in (code_versions._facts, code_versions._facts_cache, code_versions._imported_names,
                   code_versions._origin, code_versions.module_hash):
        cached.cache_clear()


def test_the_code_facts_cache_gives_what_parsing_gives_and_survives_damage(tmp_path, monkeypatch):
    import json

    from lexiflow.tasks import code_versions
    from lexiflow.tasks.lm import train_lm

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(code_versions, "_facts_of", counted := _counting(code_versions._facts_of))
    modules = ["lexiflow.tasks.lm", "lexiflow.models.lm.ngram", "lexiflow.models.ingest"]

    def derive():
        _forget(code_versions)
        return (code_modules(train_lm.fn.__wrapped__), [code_versions.module_hash(m) for m in modules],
                [code_versions._imported_names(m) for m in modules])

    try:
        parsed = derive()
        assert counted.calls >= len(modules)
        entries = json.loads(code_versions.facts_path().read_text())
        assert code_versions.facts_path().parent == tmp_path / "lexiflow" and len(entries) >= len(modules)
        assert parsed[1] == [source_hash(code_versions._source(m)) for m in modules]

        counted.calls = 0
        assert derive() == parsed and counted.calls == 0  # read back from disk: nothing parsed

        code_versions.facts_path().write_text('{"truncated": [')  # a crash mid-write elsewhere, a full disk
        assert derive() == parsed and counted.calls > 0
        assert len(json.loads(code_versions.facts_path().read_text())) >= len(modules)  # rewritten whole
    finally:
        _forget(code_versions)


def _counting(fn):
    def counted(*args):
        counted.calls += 1
        return fn(*args)
    counted.calls = 0
    return counted


def test_the_corpus_stages_do_not_follow_the_ngram_model():
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.lm import train_lm
    from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

    # their pieces live in tasks/pieces.py; the n-gram LM's in tasks/ngram_pieces.py
    for stage in (ingest_corpus, learn_vocabulary, encode_corpus):
        assert "models.lm.ngram" not in short(stage.code_modules({})), stage.name
    assert {"models.lm.ngram", "tasks.ngram_pieces"} <= short(train_lm.code_modules({"model": "ngram"}))
