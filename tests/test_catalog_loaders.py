"""Catalog loaders and export: each kind comes back as its natural object, equal to what the
stage wrote, and exports open in peer libraries (gensim, HF tokenizers, DuckDB) without lexiflow.

A small store is built once per backend (a local folder, and S3 served by moto on loopback:
tests/backends.py) from gensim's Lee corpus by calling the stage builders directly (no Prefect):
the same code the tasks run, published through `ArtifactStore.writer`; every stage after the
corpus reads its inputs back from that store (`ArtifactStore(ref.store)`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import fsspec
import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp
from lexiflow.flows.cli import main as cli
from lexiflow.loaders import LOADERS, EvaluationReport, MatrixArtifact, load
from lexiflow.models import text, vocab
from lexiflow.models.lm.ngram import NgramLM
from lexiflow.storage import ArtifactStore, Catalog, StoreError
from lexiflow.storage.files import storage_options_for
from lexiflow.storage.formats import MATRIX, write_matrix
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.embeddings import svd_embeddings
from lexiflow.tasks.evaluation import evaluate_embeddings
from lexiflow.tasks.lm import train_lm
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.params import (
    CooccurrenceParams,
    CorpusParams,
    EvaluationParams,
    NgramParams,
    PPMIParams,
    SVDParams,
    TokenizerParams,
    VocabularyParams,
)
from lexiflow.tasks.vocabulary import encode_corpus, learn_subword, learn_vocabulary

from tests.backends import BACKENDS
from tests.stages import publish


@pytest.fixture(scope="module", params=BACKENDS)
def store(request, tmp_path_factory) -> ArtifactStore:
    url = str(tmp_path_factory.mktemp("store")) if request.param == "local" else request.getfixturevalue(
        "moto_s3").new_url()
    s = ArtifactStore(url)
    docs = publish(s, ingest_corpus, params=CorpusParams(sources=["builtin:lee"]))
    tok = publish(s, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=2))
    tokens = publish(s, encode_corpus, corpus=docs, tokenizer=tok)
    counts = publish(s, count_cooccurrence, tokens=tokens, tokenizer=tok, params=CooccurrenceParams(window=2))
    pmi = publish(s, compute_ppmi, cooccurrence=counts, params=PPMIParams())
    emb = publish(s, svd_embeddings, ppmi=pmi, params=SVDParams(dim=16))
    publish(s, evaluate_embeddings, embeddings=emb,
            params=EvaluationParams(analogy_vocabulary=100, probes=["the"], projection_words=0))
    publish(s, train_lm, tokens=tokens, tokenizer=tok, model="ngram", params=NgramParams(order=2))
    return s


def test_every_kind_of_the_pipeline_has_a_loader(store):
    assert set(Catalog(store).kinds()) <= set(LOADERS)


def test_table_kinds_load_as_the_polars_frames_in_the_store(store):
    catalog = Catalog(store)
    for kind, name in (("corpus", "documents.parquet"), ("tokenized_corpus", "tokens.parquet")):
        manifest = catalog.latest(kind)
        frame = load(catalog, kind)
        assert isinstance(frame, pl.DataFrame) and frame.height > 100
        with store.local_copy(kind, manifest["version"], name) as path:
            assert frame.equals(pl.read_parquet(path))
    assert load(catalog, "corpus").columns == ["doc_id", "source", "split", "text"]


def test_tokenizer_loads_as_the_vocabulary_that_encoded_the_corpus(store):
    catalog = Catalog(store)
    vocabulary = load(catalog, "tokenizer")
    assert isinstance(vocabulary, vocab.Vocabulary)
    assert vocabulary.tokens[:4] == list(vocab.SPECIALS)
    sentences = vocab.sentence_tokens(load(catalog, "corpus"))
    encoded = load(catalog, "tokenized_corpus")["ids"].to_list()
    assert vocabulary.encode_batch(sentences["words"], is_pretokenized=True).to_list() == encoded
    texts = vocab.sentences(load(catalog, "corpus"))["text"]
    assert vocabulary.encode_batch(texts).to_list() == encoded  # from text: the stage's own path
    assert [vocabulary.encode(t) for t in texts[:50]] == encoded[:50]


def test_matrix_loader_known_answer(store_url):
    """A hand-made 3×3 matrix round-trips, with words joined onto its cells."""
    s = ArtifactStore(store_url)
    dense = np.array([[0, 2.5, 0], [2.5, 0, 1.0], [0, 1.0, 0]])
    with s.writer("ppmi", "00000000000000aa") as out:
        write_matrix(out, "matrix.parquet", sp.csr_matrix(dense))
        out.write_parquet("vocab.parquet", pl.DataFrame({"id": [0, 1, 2], "token": ["a", "b", "c"],
                                                         "count": [3, 2, 1]}))
    loaded = load(Catalog(s), "ppmi")
    assert isinstance(loaded, MatrixArtifact) and loaded.term_document is None
    np.testing.assert_array_equal(loaded.matrix.toarray(), dense)
    cells = loaded.to_polars().sort("row", "col")
    assert cells.select("row_word", "col_word", "value").rows() == [("a", "b", 2.5), ("b", "a", 2.5),
                                                                     ("b", "c", 1.0), ("c", "b", 1.0)]
    assert s.read_parquet("ppmi", "00000000000000aa", "matrix.parquet").schema == pl.Schema(
        {f.name: pl.from_arrow(MATRIX.empty_table()).schema[f.name] for f in MATRIX})


def test_cooccurrence_loads_with_its_term_document_matrix(store):
    counts = load(Catalog(store), "cooccurrence")
    n = counts.vocabulary.height
    assert counts.matrix.shape == (n, n) and (counts.matrix != counts.matrix.T).nnz == 0  # symmetric window
    assert counts.term_document.shape[0] == n
    assert counts.to_polars().height == counts.matrix.nnz


def test_embeddings_load_as_keyed_vectors_equal_to_gensims_reading_of_the_word2vec_file(store):
    from gensim.models import KeyedVectors

    manifest = Catalog(store).latest("embeddings")
    kv = load(Catalog(store), "embeddings")
    with store.local_copy("embeddings", manifest["version"], "vectors.txt") as path:
        oracle = KeyedVectors.load_word2vec_format(str(path), binary=False)
    assert kv.index_to_key == oracle.index_to_key
    np.testing.assert_allclose(kv.vectors, oracle.vectors, atol=1e-5)
    assert kv.vector_size == 16 and kv.get_vecattr(kv.index_to_key[0], "count") >= kv.get_vecattr(
        kv.index_to_key[-1], "count")


def test_evaluation_and_lm_load_with_the_manifest_figures(store):
    catalog = Catalog(store)
    report = load(catalog, "evaluation")
    assert isinstance(report, EvaluationReport) and report.markdown.startswith("#")
    metrics = catalog.latest("evaluation")["metrics"]
    assert report.metrics["ws353_spearman"][0] == pytest.approx(metrics["ws353_spearman"])
    lm = load(catalog, "lm")
    assert isinstance(lm, NgramLM) and lm.order == 2
    valid = [np.asarray(ids, dtype=np.int64) for ids in
             load(catalog, "tokenized_corpus").filter(pl.col("split") == "valid")["ids"].to_list()]
    assert lm.perplexity(valid) == pytest.approx(catalog.latest("lm")["metrics"]["valid_perplexity"])


def test_reports_load_through_the_stores_retried_reads(tmp_path, monkeypatch):
    """A transient error opening report.md is retried (ArtifactStore.read_text), as for every other file."""
    store = ArtifactStore(tmp_path)
    with store.writer("report", "a" * 16) as out:
        out.write_text("report.md", "# report\n")
    with store.writer("evaluation", "b" * 16) as out:
        out.write_text("report.md", "# evaluation\n")
        for name in ("metrics", "neighbours", "analogy_sections"):
            out.write_parquet(f"{name}.parquet", pl.DataFrame({"x": [1]}))
    real_open, failures = ArtifactStore.open, []

    def flaky_open(self, kind, version, name, mode="rb"):
        if name == "report.md" and len(failures) < 2 and kind not in failures:
            failures.append(kind)
            raise TimeoutError("simulated storage timeout")
        return real_open(self, kind, version, name, mode)

    monkeypatch.setattr(ArtifactStore, "open", flaky_open)
    catalog = Catalog(store)
    assert load(catalog, "report") == "# report\n"
    assert load(catalog, "evaluation").markdown == "# evaluation\n"
    assert failures == ["report", "evaluation"]


def test_get_by_version_lineage_and_unknown_kind(store):
    catalog = Catalog(store)
    emb = catalog.latest("embeddings")
    assert load(catalog, "embeddings", emb["version"]).index_to_key == load(catalog, "embeddings").index_to_key
    # The listed path is what a reader outside lexiflow opens: a full URL on an object store.
    assert emb["path"].startswith("s3://") != store.is_local
    fs, root = fsspec.core.url_to_fs(emb["path"], **storage_options_for(emb["path"]))
    assert json.loads(fs.cat(root + "/manifest.json"))["version"] == emb["version"]
    chain, node = [], catalog.lineage(emb["version"])
    while node["inputs"]:
        chain.append(node["kind"])
        node = next(iter(node["inputs"].values()))
    assert chain + [node["kind"]] == ["embeddings", "ppmi", "cooccurrence", "tokenized_corpus", "corpus"]
    with store.writer("mystery", "00000000000000bb") as out:
        out.write_text("x.txt", "?")
    with pytest.raises(StoreError, match="no loader for 'mystery'"):
        load(catalog, "mystery")
    with pytest.raises(StoreError, match="no glove artifact"):
        load(catalog, "glove")


def test_storage_and_the_loaders_import_no_model_until_one_loads():
    """storage/ imports no model (the loader map sits above both, in lexiflow.loaders, whose loaders
    import a model only to load one)."""
    code = ("import sys, lexiflow.storage, lexiflow.storage.export, lexiflow.storage.formats, lexiflow.loaders; "
            "print(sorted(m for m in sys.modules if m.startswith('lexiflow.models') "
            "or m.split('.')[0] in ('gensim', 'torch', 'prefect')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # the static check of storage/'s imports: tests/test_layers.py


def test_export_embeddings_and_tokenizer_open_in_peer_libraries(store, tmp_path, capsys):
    from gensim.models import KeyedVectors
    from tokenizers import Tokenizer

    assert cli(["artifacts", "export", "embeddings", str(tmp_path / "emb"), "--store", store.url]) == 0
    printed = capsys.readouterr().out.split()
    assert {p.rsplit("/", 1)[1] for p in printed} >= {"vectors.txt", "vectors.bin", "vectors.parquet", "manifest.json"}
    kv = KeyedVectors.load_word2vec_format(str(tmp_path / "emb" / "vectors.bin"), binary=True)
    np.testing.assert_allclose(kv.vectors, load(Catalog(store), "embeddings").vectors, atol=1e-6)

    version = Catalog(store).latest("tokenizer")["version"]
    assert cli(["artifacts", "export", f"tokenizer:{version}", str(tmp_path / "tok"), "--store", store.url]) == 0
    hf = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    vocabulary = load(Catalog(store), "tokenizer", version)
    for sentence in RAW:  # raw text, as a user gives it: lexiflow cleans it as ingestion cleaned the corpus
        ours = vocabulary.encode(text.normalize(sentence, lowercase=True))
        assert hf.encode(sentence).ids == ours  # the export lowercases, as the corpus stage did
    assert json.loads((tmp_path / "tok" / "manifest.json").read_text())["version"] == version


# Mixed case, punctuation, a control character and decomposed accents (NFD): what ingestion cleans.
RAW = ["The Kings of Leiden, Mr. SMITH -- said (again) 3.14! ΟΔΥΣΣΕΥΣ", "the prime minister's well-known plan cost "
       "1,000.50 dollars <unk> today!", "Zyxwv QQQ\x07 Cafe\u0301 NAI\u0308VE R\u00e9sum\u00e9"]


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_exported_subword_tokenizers_encode_raw_text_as_lexiflow_does(store, tmp_path, kind):
    from tokenizers import Tokenizer

    corpus = Catalog(store).ref("corpus")
    ref = publish(store, learn_subword, corpus=corpus, params=TokenizerParams(kind=kind, vocab_size=300))
    assert cli(["artifacts", "export", f"tokenizer:{ref.version}", str(tmp_path / kind), "--store", store.url]) == 0
    hf = Tokenizer.from_file(str(tmp_path / kind / "tokenizer.json"))
    ours = load(Catalog(store), "tokenizer", ref.version)
    assert ours.lowercase  # the Lee corpus is lowercased: the tokenizer learnt that from its input
    for sentence in RAW:
        ids = ours.encode(sentence)
        assert hf.encode(sentence).ids == ids
        assert ids == ours.encode(text.normalize(sentence, lowercase=True))  # as `lexiflow generate` encodes
    assert ours.encode("The Kings of Leiden") == ours.encode("the kings of leiden")
    assert ours.unk_id not in ours.encode("The Kings")


def test_export_refuses_a_file_as_destination(store, tmp_path):
    (tmp_path / "file").write_text("x")
    assert cli(["artifacts", "export", "corpus", str(tmp_path / "file"), "--store", store.url]) == 2


def test_lm_table_names_tokenizers_and_compares_them_per_word(store):
    from lexiflow.tasks.report import write_report

    catalog = Catalog(store)
    docs, words = catalog.ref("corpus"), catalog.ref("tokenizer", **{"kind": "word"})
    bpe = publish(store, learn_subword, corpus=docs, params=TokenizerParams(kind="bpe", vocab_size=300))
    lms = {}
    for name, tok in (("word", words), ("bpe", bpe)):
        ids = publish(store, encode_corpus, corpus=docs, tokenizer=tok)
        lms[name] = publish(store, train_lm, tokens=ids, tokenizer=tok, model="ngram", params=NgramParams(order=2))
    metrics = {name: store.manifest("lm", ref.version)["metrics"] for name, ref in lms.items()}
    assert metrics["word"]["valid_word_perplexity"] == pytest.approx(metrics["word"]["valid_perplexity"])
    # BPE: the same total log-probability spread over the corpus's words (and </s>), counted here on their own
    documents = store.read_parquet("corpus", docs.version, "documents.parquet").filter(pl.col("split") == "valid")
    sentences = [s for d in documents["text"] for s in d.split("\n")]
    n_words = sum(len(text.pretokenize(s)) + 1 for s in sentences)
    tokens = store.read_parquet("tokenized_corpus", store.manifest("lm", lms["bpe"].version)["inputs"]["tokens"][
        "version"], "tokens.parquet").filter(pl.col("split") == "valid")
    n_tokens = int(tokens["ids"].list.len().sum()) + tokens.height
    assert n_tokens > n_words  # subwords: more units than words
    expected = np.exp(np.log(metrics["bpe"]["valid_perplexity"]) * n_tokens / n_words)
    assert metrics["bpe"]["valid_word_perplexity"] == pytest.approx(expected, rel=1e-9)
    assert metrics["bpe"]["device"]["type"] == "cpu" and metrics["bpe"]["device"]["precision"] == "fp64"

    evaluation = catalog.ref("evaluation")
    report = publish(store, write_report, evaluations=[evaluation], lms=[lms["word"], lms["bpe"]])
    markdown = store.read_text("report", report.version, "report.md")
    header = next(line for line in markdown.splitlines() if line.startswith("| model | tokenizer |"))
    assert "valid_word_perplexity" in header and "test_word_perplexity" in header
    rows = [line for line in markdown.splitlines() if line.startswith("| ngram |")]
    assert [row.split(" | ")[1] for row in rows] == ["word", "bpe"]
    lineage = markdown[markdown.index("## Lineage"):]
    for ref in (docs, words, bpe, lms["bpe"], evaluation):  # every artifact behind the report, once
        assert lineage.count(f"| {ref.kind}:{ref.version} |") == 1
    assert lineage.index(f"| corpus:{docs.version} |") < lineage.index(f"| lm:{lms['bpe'].version} |")

