"""The notes' count-based models and Transformer read-out as pipeline stages (no Prefect), on the Lee
corpus: LSI beside PPMI-SVD, PPMI of the term-term matrix X·Xᵀ in log2, and the logit-lens table of a
Transformer LM in the report."""

import pytest
from lexiflow.storage import ArtifactStore
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.embeddings import lsi_embeddings, svd_embeddings
from lexiflow.tasks.evaluation import evaluate_embeddings
from lexiflow.tasks.lm import train_lm
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.params import (
    CooccurrenceParams,
    CorpusParams,
    EvaluationParams,
    LSIParams,
    NeuralLMParams,
    PPMIParams,
    SVDParams,
    VocabularyParams,
)
from lexiflow.tasks.report import write_report
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

from tests.stages import publish

pytestmark = pytest.mark.slow  # ~40 s: the Lee corpus through the count stages and a small Transformer


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    s = ArtifactStore(str(tmp_path_factory.mktemp("store")))
    docs = publish(s, ingest_corpus, params=CorpusParams(sources=["builtin:lee"]))
    tok = publish(s, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=2))
    tokens = publish(s, encode_corpus, corpus=docs, tokenizer=tok)
    counts = publish(s, count_cooccurrence, tokens=tokens, tokenizer=tok, params=CooccurrenceParams(window=2))
    return s, tok, tokens, counts


def test_lsi_and_termdoc_ppmi_stages(built):
    s, _, _, counts = built
    lsi = publish(s, lsi_embeddings, cooccurrence=counts, params=LSIParams(dim=16))
    metrics = s.manifest("embeddings", lsi.version)["metrics"]
    assert metrics["method"] == "lsi" and metrics["dim"] == 16 and metrics["documents"] > 100
    window = publish(s, compute_ppmi, cooccurrence=counts, params=PPMIParams())
    termdoc = publish(s, compute_ppmi, cooccurrence=counts, params=PPMIParams(counts="termdoc", alpha=1.0, log_base=2))
    assert termdoc.version != window.version
    wide = publish(s, lsi_embeddings, cooccurrence=counts, params=LSIParams(dim=2000))  # more than the documents
    wide_metrics = s.manifest("embeddings", wide.version)["metrics"]
    assert wide_metrics["dim"] == wide_metrics["documents"] - 1 and wide_metrics["dim_requested"] == 2000
    # X·Xᵀ of sentence-documents: every pair of words sharing a sentence, so denser than a +-2 window
    assert (s.manifest("ppmi", termdoc.version)["metrics"]["nonzeros"]
            > s.manifest("ppmi", window.version)["metrics"]["nonzeros"])
    emb = publish(s, svd_embeddings, ppmi=termdoc, params=SVDParams(dim=16))
    for ref in (lsi, emb):
        ev = publish(s, evaluate_embeddings, embeddings=ref,
                     params=EvaluationParams(analogy_vocabulary=100, probes=["the"], projection_words=0))
        assert -1 <= s.manifest("evaluation", ev.version)["metrics"]["ws353_spearman"] <= 1


def test_transformer_lm_logit_lens_table_in_the_report(built):
    s, tok, tokens, counts = built
    params = NeuralLMParams(d_model=16, n_heads=2, n_layers=2, max_len=32, epochs=1, max_steps=20, batch_size=8,
                            bptt=16, device="cpu", norm="post", ffn_activation="relu")
    lm = publish(s, train_lm, tokens=tokens, tokenizer=tok, model="transformer", params=params)
    lens = s.manifest("lm", lm.version)["metrics"]["logit_lens"]
    assert [row["layer"] for row in lens] == [0, 1, 2]
    assert lens[-1]["perplexity"] < lens[0]["perplexity"]  # the trained output beats the raw embedding read-out
    emb = publish(s, lsi_embeddings, cooccurrence=counts, params=LSIParams(dim=16))
    ev = publish(s, evaluate_embeddings, embeddings=emb,
                 params=EvaluationParams(analogy_vocabulary=100, probes=["the"], projection_words=0))
    report = publish(s, write_report, evaluations=[ev], lms=[lm])
    text = s.read_text("report", report.version, "report.md")
    assert "Logit lens (transformer)" in text and "| layer | perplexity | accuracy |" in text


def test_extrinsic_genre_accuracy_in_the_evaluation_and_report(built, shared_data):
    s, _, _, counts = built
    emb = publish(s, lsi_embeddings, cooccurrence=counts, params=LSIParams(dim=16))
    ev = publish(s, evaluate_embeddings, embeddings=emb, params=EvaluationParams(
        analogy_vocabulary=100, probes=["the"], projection_words=0,
        genre_treebank=str(shared_data / "ud-english-ewt"), classifier_epochs=5))
    metrics = s.manifest("evaluation", ev.version)["metrics"]
    assert metrics["genre_classes"] == 5  # answers, email, newsgroup, reviews, weblog
    assert metrics["genre_test_accuracy"] > metrics["genre_majority_accuracy"] + 0.05
    report = publish(s, write_report, evaluations=[ev])
    assert "genre_test_accuracy" in s.read_text("report", report.version, "report.md")
