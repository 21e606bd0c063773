"""A small store holding one artifact of every kind and file (tiny parameters, the Lee corpus and a
few CoNLL-U sentences), for tests that check what the files are, e.g. against docs/artifacts.md."""

from __future__ import annotations

from pathlib import Path

from lexiflow.storage import ArtifactStore
from lexiflow.tasks.checks import check_artifacts
from lexiflow.tasks.corpus import ingest_corpus, ingest_tagged
from lexiflow.tasks.embeddings import glove_embeddings, svd_embeddings
from lexiflow.tasks.evaluation import evaluate_embeddings
from lexiflow.tasks.lm import train_lm
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.params import (
    ChecksParams,
    CooccurrenceParams,
    CorpusParams,
    EvaluationParams,
    GloVeParams,
    NeuralLMParams,
    NgramParams,
    PPMIParams,
    SVDParams,
    TaggerParams,
    TokenizerParams,
    VocabularyParams,
)
from lexiflow.tasks.report import write_report
from lexiflow.tasks.tagger import train_tagger
from lexiflow.tasks.vocabulary import encode_corpus, learn_subword, learn_vocabulary

from tests.stages import publish

CONLLU = "1\tthe\t_\tDET\tDT\t_\t_\t_\t_\t_\n2\tdog\t_\tNOUN\tNN\t_\t_\t_\t_\t_\n\n"


def build(folder: Path) -> ArtifactStore:
    store = ArtifactStore(folder / "store")
    docs = publish(store, ingest_corpus, params=CorpusParams(sources=["builtin:lee"]))
    words = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=2))
    ids = publish(store, encode_corpus, corpus=docs, tokenizer=words)
    counts = publish(store, count_cooccurrence, tokens=ids, tokenizer=words, params=CooccurrenceParams(window=2))
    svd = publish(store, svd_embeddings, ppmi=publish(store, compute_ppmi, cooccurrence=counts, params=PPMIParams()),
                  params=SVDParams(dim=8))
    publish(store, glove_embeddings, cooccurrence=counts, params=GloVeParams(dim=8, epochs=1))
    evaluation = publish(store, evaluate_embeddings, embeddings=svd,
                         params=EvaluationParams(analogy_vocabulary=100, probes=["the"], projection_words=0))
    bpe = publish(store, learn_subword, corpus=docs, params=TokenizerParams(kind="bpe", vocab_size=100))
    lms = [publish(store, train_lm, tokens=ids, tokenizer=words, model="ngram", params=NgramParams(order=2)),
           publish(store, train_lm, tokens=publish(store, encode_corpus, corpus=docs, tokenizer=bpe), tokenizer=bpe,
                   model="gru", params=NeuralLMParams(emb_dim=4, hidden_dim=4, num_layers=1, max_steps=2,
                                                      batch_size=2, bptt=4, device="cpu"))]
    for name in ("t-train.conllu", "t-dev.conllu"):
        (folder / name).write_text(CONLLU * 5, encoding="utf-8")
    tagged = publish(store, ingest_tagged, params=CorpusParams(sources=[str(folder / "t-train.conllu"),
                                                                        str(folder / "t-dev.conllu")]))
    tagger = publish(store, train_tagger, tagged=tagged, column="upos", params=TaggerParams(order=2))
    checked = publish(store, check_artifacts, candidates={"corpus": docs, "tokenized_corpus": ids, "evaluation.svd":
                                                          evaluation, "lm.ngram": lms[0], "tagger.upos": tagger},
                      released=None, params=ChecksParams())
    publish(store, write_report, evaluations=[evaluation], lms=lms, taggers=[tagger], checks=checked)
    return store
