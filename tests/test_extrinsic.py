"""models.extrinsic: the review's two-hidden-layer FFNN (notes 000) on averaged word vectors, EWT genre
labels from sent_id prefixes (notes 001 "Extrinsic Evaluation")."""

import numpy as np
import pytest
import torch
from lexiflow.models.errors import InputError
from lexiflow.models.extrinsic import (
    ClassifierConfig,
    FeedForwardClassifier,
    average_vectors,
    genre,
    genre_accuracy,
    read_genre_splits,
)


def test_genre_is_the_sent_id_prefix():
    assert genre("weblog-juancole.com_juancole_20051126063000_ENG_20051126_063000-0001") == "weblog"
    assert genre("answers-20111105112131AA6gIX6_ans-0005") == "answers"
    with pytest.raises(InputError, match="no genre prefix"):
        genre("0001")


def test_network_is_the_reviews_ffnn():
    """000: h1 = f(W1 x + b1) in R^d1, h2 = f(W2 h1 + b2) in R^d2, y = Wo h2 (Wo in R^{C x d2}, no bias)."""
    c = ClassifierConfig(classifier_hidden1=4, classifier_hidden2=3, classifier_activation="sigmoid")
    net = FeedForwardClassifier(d=5, n_classes=2, c=c)
    assert sum(p.numel() for p in net.parameters()) == 4 * (5 + 1) + 3 * (4 + 1) + 2 * 3
    x = torch.randn(7, 5)
    h1 = torch.sigmoid(x @ net.hidden1.weight.T + net.hidden1.bias)
    h2 = torch.sigmoid(h1 @ net.hidden2.weight.T + net.hidden2.bias)
    torch.testing.assert_close(net(x), h2 @ net.output.weight.T)


def test_average_vectors_skip_unknown_words():
    words = ["a", "b"]
    matrix = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    x, coverage = average_vectors([["A", "b", "zzz"], ["zzz"]], words, matrix)
    np.testing.assert_allclose(x, [[0.5, 1.0], [0.0, 0.0]])
    assert coverage == pytest.approx(2 / 4)


def write_treebank(folder, rng):
    """A tiny UD-style treebank: genre g's sentences draw most words from its own list."""
    lexicon = {"email": ["meeting", "thanks", "attached"], "reviews": ["great", "food", "service"],
               "weblog": ["iraq", "government", "troops"]}
    shared = ["the", "a", "is"]
    for split, n in (("train", 90), ("dev", 30), ("test", 30)):
        lines = []
        for i in range(n):
            g = list(lexicon)[i % 3]
            words = list(rng.choice(lexicon[g], 3)) + list(rng.choice(shared, 2))
            lines += [f"# sent_id = {g}-doc{i}-0001", f"# text = {' '.join(words)}"]
            lines += [f"{k + 1}\t{w}\t{w}\tX\tX\t_\t0\tdep\t_\t_" for k, w in enumerate(words)] + [""]
        (folder / f"toy-ud-{split}.conllu").write_text("\n".join(lines) + "\n")


def test_genre_accuracy_learns_genre_words_and_beats_the_majority(tmp_path):
    rng = np.random.default_rng(0)
    write_treebank(tmp_path, rng)
    splits = read_genre_splits(tmp_path)
    assert set(splits["train"][1]) == {"email", "reviews", "weblog"}
    words = ["meeting", "thanks", "attached", "great", "food", "service", "iraq", "government", "troops", "the"]
    matrix = rng.normal(size=(len(words), 8)).astype(np.float32)
    metrics = genre_accuracy(words, matrix, tmp_path, ClassifierConfig(classifier_epochs=40, classifier_lr=1e-2))
    assert metrics["genre_classes"] == 3
    assert metrics["genre_majority_accuracy"] == pytest.approx(1 / 3)
    assert metrics["genre_test_accuracy"] > 0.9 and metrics["genre_dev_accuracy"] > 0.9
    assert metrics["genre_token_coverage"] == pytest.approx(0.6, abs=0.15)  # "a", "is" are unknown
    # vectors that carry no information give no better than chance
    blind = genre_accuracy(words, np.zeros_like(matrix), tmp_path, ClassifierConfig(classifier_epochs=5))
    assert blind["genre_test_accuracy"] < 0.5


def test_missing_split_is_a_one_line_error(tmp_path):
    (tmp_path / "toy-ud-train.conllu").write_text("")
    with pytest.raises(InputError, match="dev.conllu"):
        read_genre_splits(tmp_path)
