"""The estimator base (scikit-learn's contract): parameters read from `__init__`, `fit` returns self,
learned state ends in `_`, one not-fitted check, and the saved configs the hand-kept lists wrote."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import scipy.sparse as sp
from lexiflow.models.errors import ParameterError
from lexiflow.models.estimator import Estimator
from lexiflow.models.glove import GloVe
from lexiflow.models.lm.ngram import NgramLM
from lexiflow.models.lm.rnn import RNNLM, RNNConfig
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.tokenizers import BPE, WordPiece
from lexiflow.models.word2vec import Word2Vec

TEXTS = ["low lower lowest", "newer wider new", "low new"]
ESTIMATORS = {
    "ngram": lambda: NgramLM(order=2, smoothing="add_k", k=0.5, vocab_size=12),
    "bpe": lambda: BPE(vocab_size=30, marker="glued", unk_token="<unk>"),
    "wordpiece": lambda: WordPiece(vocab_size=30, prefix="@@", max_input_chars_per_word=9),
    "rnn": lambda: RNNLM(RNNConfig(12, cell="gru", emb_dim=4, hidden_dim=4), TrainConfig(max_steps=1)),
    "word2vec": lambda: Word2Vec(sg=False, dim=8, epochs=2),
    "glove": lambda: GloVe(dim=4, epochs=1, device="cpu"),
}
FITS = {
    "ngram": lambda e: e.fit([np.array([4, 5, 6]), np.array([5, 7])]),
    "bpe": lambda e: e.fit(TEXTS),
    "wordpiece": lambda e: e.fit(TEXTS),
    "glove": lambda e: e.fit(sp.csr_matrix(np.array([[0, 2.0, 1.0], [2.0, 0, 3.0], [1.0, 3.0, 0]]))),
}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_get_params_are_the_init_parameters_and_rebuild_an_equal_estimator(name):
    estimator = ESTIMATORS[name]()
    params = estimator.get_params()
    assert list(params) == list(inspect.signature(type(estimator).__init__).parameters)[1:]
    assert type(estimator)(**params).get_params() == params
    assert not estimator.is_fitted()


@pytest.mark.parametrize("name", FITS)
def test_fit_returns_self_learns_state_ending_in_underscore_and_keeps_the_parameters(name):
    estimator = ESTIMATORS[name]()
    with pytest.raises(ParameterError, match=f"{type(estimator).__name__} is not fitted: call fit"):
        estimator._check_fitted()
    before = estimator.get_params()
    assert FITS[name](estimator) is estimator
    assert estimator.is_fitted() and estimator.get_params() == before
    learned = [k for k in vars(estimator) if k.endswith("_") and not k.startswith("_")]
    assert learned and not set(learned) & set(before)
    estimator._check_fitted()


def test_saved_configs_hold_the_parameters_the_hand_kept_lists_wrote(tmp_path):
    """Artifacts stay as they were: the same keys, in the same order, with the same values (plus the
    subword tokenizers' `lowercase`, which issue 26 added to make exports encode as lexiflow does)."""
    bpe = ESTIMATORS["bpe"]().fit(TEXTS)
    bpe.save(tmp_path / "bpe")
    assert json.loads((tmp_path / "bpe" / "config.json").read_text())["params"] == {
        "vocab_size": 30, "end_of_word": "</w>", "marker": "glued", "special_tokens": ["<unk>", "<s>", "</s>", "<pad>"],
        "unk_token": "<unk>", "pretokenizer": "word", "min_frequency": 2, "lowercase": False}
    wp = ESTIMATORS["wordpiece"]().fit(TEXTS)
    wp.save(tmp_path / "wp")
    assert list(json.loads((tmp_path / "wp" / "config.json").read_text())["params"]) == [
        "vocab_size", "prefix", "special_tokens", "unk_token", "pretokenizer", "min_frequency",
        "lowercase", "max_input_chars_per_word"]
    ngram = FITS["ngram"](ESTIMATORS["ngram"]())
    ngram.save(tmp_path / "ngram")
    assert json.loads((tmp_path / "ngram" / "config.json").read_text()) == {
        "format": "lexiflow.ngram", "format_version": 1, "order": 2, "smoothing": "add_k", "discount": 0.0, "k": 0.5,
        "min_count": 2, "vocab_size": 12, "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": 3, "vocab_size_": 12}
    assert NgramLM.load(tmp_path / "ngram").get_params() == ngram.get_params()
    assert list(Word2Vec().get_params()) == ["sg", "dim", "window", "negative", "sample", "epochs", "ns_exponent",
                                             "seed", "workers", "min_count", "vectors"]  # issue 25: u, v or u+v


def test_an_estimator_names_every_parameter():
    class Loose(Estimator):
        def __init__(self, a: int = 1, **options) -> None:
            self.a = a

    with pytest.raises(TypeError, match=r"Loose.__init__ takes \*options"):
        Loose().get_params()
