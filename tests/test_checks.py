"""Release checks: known answers on hand-made figures (models/checks.py), the checks stage on hand-made artifacts
(tasks/checks.py), and the alias names a run's artifacts are released under (flows/release.py)."""

from __future__ import annotations

import math

import polars as pl
import pytest
from lexiflow.flows.release import aliases
from lexiflow.models import checks
from lexiflow.models.config import from_section
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.storage.formats import DOCUMENTS, TOKENS, read_manifest
from lexiflow.tasks.checks import check_artifacts
from lexiflow.tasks.params import ChecksParams

DEFAULTS = ChecksParams()


def judged(kind: str, figures: dict, released: dict | None, **settings) -> dict[str, checks.Result]:
    params = ChecksParams(**settings)
    results = checks.run_checks(kind, kind, figures, released, from_section(checks.CHECKS[kind].thresholds, params),
                                frozenset(params.advisory))
    return {r.check: r for r in results}


def test_corpus_counts_within_the_tolerance_of_the_released_corpus():
    released = {"documents": 1000, "tokens": 100_000, "odd_character_share": 0.0}
    ok = judged("corpus", {"documents": 1249, "tokens": 75_000, "odd_character_share": 0.0}, released)
    assert all(r.passed for r in ok.values())
    assert ok["tokens"].limit == 125_000 and ok["tokens"].released == 100_000
    tenth = judged("corpus", {"documents": 100, "tokens": 10_000, "odd_character_share": 0.0}, released)
    assert not tenth["documents"].passed and not tenth["tokens"].passed
    assert tenth["tokens"].limit == 75_000  # the bound it fell below
    assert tenth["tokens"].line() == "corpus.tokens 1e+04 fails within ±25% of released 1e+05: [7.5e+04, 1.25e+05]"
    garbled = judged("corpus", {"documents": 1000, "tokens": 100_000, "odd_character_share": 0.0011}, released)
    assert not garbled["odd_character_share"].passed and garbled["odd_character_share"].limit == 1e-3


def test_a_first_build_meets_absolute_floors():
    first = judged("corpus", {"documents": 9, "tokens": 10_000, "odd_character_share": 0.0}, None)
    assert not first["documents"].passed and first["documents"].rule == "≥ floor 10"
    assert first["tokens"].passed and first["tokens"].released is None


def test_odd_characters_are_replacement_private_use_unassigned_and_control_characters():
    texts = pl.Series(["ab\ufffdc", "\ue000x\x07", "plain text", "\U000e0080"])  # U+E0080 is unassigned
    assert checks.odd_character_counts(texts) == (4, 4 + 3 + 10 + 1)


def test_held_out_coverage_counts_only_valid_and_test_tokens():
    tokens = pl.DataFrame({"split": ["train", "valid", "test"], "ids": [[0, 0, 0], [4, 0, 5], [6, 7]]})
    assert checks.held_out_counts(tokens, unk_id=0) == (4, 5)
    lower = judged("tokenized_corpus", {"held_out_coverage": 0.77}, {"held_out_coverage": 0.8})
    assert not lower["held_out_coverage"].passed and math.isclose(lower["held_out_coverage"].limit, 0.78)


def test_embeddings_against_the_released_and_the_random_vector_floor():
    released = {"ws353_spearman": 0.60, "simlex999_spearman": 0.30}
    figures = {"ws353_spearman": 0.56, "simlex999_spearman": 0.24, "ws353_oov_rate": 0.0, "simlex999_oov_rate": 0.0}
    result = judged("evaluation", figures, released)
    assert result["ws353_spearman"].passed  # 0.56 >= 0.60 - 0.05
    assert not result["simlex999_spearman"].passed and math.isclose(result["simlex999_spearman"].limit, 0.25)
    # first build: 3 / sqrt(n - 1) over the n pairs evaluated; 353 pairs with 3% OOV: n = 342.41
    first = judged("evaluation", {**figures, "ws353_oov_rate": 0.03, "ws353_spearman": 0.163}, None)
    assert math.isclose(first["ws353_spearman"].limit, 3 / math.sqrt(353 * 0.97 - 1))
    assert first["ws353_spearman"].passed and math.isclose(first["simlex999_spearman"].limit, 3 / math.sqrt(998))
    nan = judged("evaluation", {**figures, "ws353_spearman": float("nan")}, released)
    assert not nan["ws353_spearman"].passed and "not measured" in nan["ws353_spearman"].line()


def test_language_model_perplexity_against_released_times_one_plus_epsilon_or_the_vocabulary():
    released = {"valid_word_perplexity": 200.0, "valid_perplexity": 200.0}
    assert judged("lm", {"valid_word_perplexity": 210.0}, released)["valid_word_perplexity"].passed
    worse = judged("lm", {"valid_word_perplexity": 210.1}, released)["valid_word_perplexity"]
    assert not worse.passed and worse.limit == 210.0 and worse.line() == (
        "lm.valid_word_perplexity 210.1 fails ≤ released 200 × (1 + 0.05) = 210")
    first = judged("lm", {"valid_perplexity": 501.0, "vocabulary_size": 1000}, None)["valid_perplexity"]
    assert not first.passed and first.limit == 500 and first.rule == "≤ 0.5 × vocabulary size 1000 = 500"


def test_scores_of_taggers_translation_and_fine_tuning_against_released_minus_delta():
    assert not judged("tagger", {"accuracy": 0.939}, {"accuracy": 0.95})["accuracy"].passed
    assert judged("tagger", {"accuracy": 0.94}, {"accuracy": 0.95})["accuracy"].passed
    assert judged("seq2seq", {"valid_bleu": 11.0}, {"valid_bleu": 12.0})["valid_bleu"].passed
    assert not judged("seq2seq", {"valid_bleu": 0.9}, None)["valid_bleu"].passed
    assert not judged("finetuned", {"accuracy": None}, {"accuracy": 0.9})["accuracy"].passed  # not measured
    assert judged("finetuned", {"accuracy": 0.88}, {"accuracy": 0.9})["accuracy"].passed


def test_advisory_checks_report_without_blocking():
    results = list(judged("tagger", {"accuracy": 0.5}, {"accuracy": 0.95}, advisory=["tagger.accuracy"]).values())
    assert not results[0].passed and not results[0].blocking and checks.blocking_failures(results) == []
    assert checks.run_checks("cooccurrence", "cooccurrence", {}, None, None) == []  # a kind without checks


def test_aliases_of_a_runs_artifacts():
    refs = {name: ArtifactRef(store="s", kind=name.split(".")[0], version="0" * 16)
            for name in ("corpus", "tokenizer", "tokenizer.bpe", "embeddings.svd", "embeddings.sgns",
                         "tagger.upos", "tagger.bilstm+elmo.upos")}
    assert aliases(refs, "production") == {
        "corpus": ["production"], "tokenizer": ["production"], "tokenizer.bpe": ["production-bpe"],
        "embeddings.svd": ["production", "production-svd"], "embeddings.sgns": ["production-sgns"],
        "tagger.upos": ["production", "production-upos"], "tagger.bilstm+elmo.upos": ["production-bilstm-elmo-upos"]}


@pytest.mark.prefect
def test_the_checks_stage_measures_the_data_and_records_each_result(tmp_path):
    """A corpus a tenth of the released one, its held-out text half covered: the checks artifact records both
    failures with their numbers, and its inputs name both sides."""
    from prefect import flow

    store = ArtifactStore(tmp_path)

    def corpus(version: str, documents: int, words: int) -> ArtifactRef:
        with store.writer("corpus", version) as out:
            text = " ".join(["w"] * words)
            out.write_parquet("documents.parquet", pl.DataFrame({
                "doc_id": [str(i) for i in range(documents)], "source": ["x"] * documents,
                "split": ["train"] * documents, "text": [text + "\ufffd"] * documents}), DOCUMENTS)
            out.metrics.update({"documents": documents, "tokens": documents * words})
        return store.ref("corpus", version)

    def tokens(version: str, held_out: list[list[int]]) -> ArtifactRef:
        with store.writer("tokenized_corpus", version) as out:
            out.write_parquet("tokens.parquet", pl.DataFrame({
                "doc_index": range(len(held_out) + 1), "sentence": [0] * (len(held_out) + 1),
                "split": ["train"] + ["valid"] * len(held_out), "ids": [[0, 0]] + held_out}), TOKENS)
        return store.ref("tokenized_corpus", version)

    released = {"corpus": corpus("a" * 16, 100, 999), "tokenized_corpus": tokens("b" * 16, [[4, 5], [6, 7]])}
    candidates = {"corpus": corpus("c" * 16, 10, 999), "tokenized_corpus": tokens("d" * 16, [[4, 0], [0, 7]])}

    @flow
    def run() -> ArtifactRef:
        return check_artifacts(str(tmp_path), candidates=candidates, released=released, params=DEFAULTS)

    manifest = read_manifest(run())
    assert set(manifest["inputs"]) == {"candidates.corpus", "candidates.tokenized_corpus", "released.corpus",
                                       "released.tokenized_corpus"}
    results = {f"{row['artifact']}.{row['check']}": row for row in manifest["metrics"]["results"]}
    assert results["corpus.documents"]["value"] == 10 and not results["corpus.documents"]["passed"]
    odd = results["corpus.odd_character_share"]  # one U+FFFD after 999 words and 998 spaces
    assert odd["value"] == 1 / 1998 and odd["passed"]
    coverage = results["tokenized_corpus.held_out_coverage"]
    assert (coverage["value"], coverage["released"], coverage["passed"]) == (0.5, 1.0, False)
    assert manifest["metrics"]["passed"] is False and manifest["metrics"]["blocking_failures"] == 3


@pytest.mark.parametrize("pieces", [False, True])
def test_corpus_and_tokenized_corpus_record_the_figures_the_checks_would_measure(tmp_path, pieces):
    """The odd-character share and the held-out coverage are counted as the corpus is read and encoded (a rebuild
    from pieces adds them up), so the checks read them instead of scanning the data again: the same figures."""
    from lexiflow.tasks.checks import MEASURE, figures
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.params import CorpusParams, ParallelParams, VocabularyParams
    from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

    from tests.stages import publish

    source = tmp_path / "animals.txt"
    words = "cat dog bird fish cow horse sheep goat mouse owl fox bear wolf deer hare lynx seal crab".split()
    source.write_text("".join(" ".join(words[(i * 7 + j * (i % 5 + 1)) % len(words)] for j in range(3 + i % 6))
                              + f" {'rare' if i % 9 == 0 else 'and'}{i % 13} .\n" for i in range(400))
                      + "a caf\ufffd sign \ue000 .\n")  # odd characters cleaning keeps
    store = ArtifactStore(tmp_path / "store")
    parallel = ParallelParams(runner="local", shard_rows=60, pieces=pieces)
    docs = publish(store, ingest_corpus, params=CorpusParams(sources=[str(source)], valid_fraction=0.2,
                                                             test_fraction=0.2), parallel=parallel)
    vocabulary = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=3), parallel=parallel)
    tokens = publish(store, encode_corpus, corpus=docs, tokenizer=vocabulary, parallel=parallel)
    odd = read_manifest(docs)["metrics"]["odd_character_share"]
    assert odd > 0 and odd == MEASURE["odd_character_share"](docs) == figures(docs)["odd_character_share"]
    recorded = read_manifest(tokens)["metrics"]["held_out_coverage"]
    assert 0.5 < recorded < 1  # some held-out words are unknown to the train split's vocabulary
    assert recorded == MEASURE["held_out_coverage"](tokens) == figures(tokens)["held_out_coverage"]
