"""models.skipgram: the full-softmax skip-gram of the midterm review (notes 000, "Skip-gram w/ negative
sampling (SGNS)", the gradient box), its gradients against the review's closed forms."""

import numpy as np
import pytest
import torch
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.skipgram import SkipGramSoftmax, closed_form_gradients, pairs, train, word_vectors


def test_autograd_gradients_equal_the_reviews_closed_forms():
    """000: dy/du_t = -v_c + sum_k P(k|t) v_k; dy/dv_k = (P(k|t) - 1) u_t for k = c, P(k|t) u_t otherwise."""
    model = SkipGramSoftmax(vocab_size=7, dim=5, seed=3)
    with torch.no_grad():
        model.u.mul_(10)
        model.v.mul_(10)  # away from the tiny init, so P(k|t) is far from uniform
    t, c = 2, 5
    loss = model(torch.tensor([t]), torch.tensor([c]))
    loss.backward()
    grad_u, grad_v = closed_form_gradients(model.u[t].detach(), model.v.detach(), c)
    torch.testing.assert_close(model.u.grad[t], grad_u)
    torch.testing.assert_close(model.v.grad, grad_v)
    assert not model.u.grad[[0, 1, 3, 4, 5, 6]].any()  # only the center's u moves
    # y itself is -log P(c|t) with the softmax over u_t . v_k
    log_p = torch.log_softmax(model.v.detach() @ model.u.detach()[t], 0)
    assert float(loss.detach()) == pytest.approx(float(-log_p[c]), rel=1e-5)
    assert 0.05 < float(loss.detach()) < 5  # a pair of moderate probability, not a saturated one


def test_pairs_within_the_window():
    centers, contexts = pairs([[0, 1, 2], [3]], window=1)
    assert sorted(zip(centers.tolist(), contexts.tolist(), strict=True)) == [(0, 1), (1, 0), (1, 2), (2, 1)]
    with pytest.raises(InputError, match="no sentence has two words"):
        pairs([[1]], window=2)
    with pytest.raises(ParameterError, match="window"):
        pairs([[1, 2]], window=0)


def test_training_lowers_the_loss_and_groups_words_that_share_contexts():
    """Words 0-3 only ever appear with each other, words 4-7 likewise: after training, each word's u is
    closer (cosine) to its own group than to the other."""
    rng = np.random.default_rng(0)
    sentences = [rng.choice(4, 6) + 4 * (i % 2) for i in range(300)]
    model, history = train(sentences, vocab_size=8, dim=8, window=2, epochs=8, lr=0.5, seed=1)
    assert history[-1] < history[0]
    assert history[-1] < np.log(8) * 0.8  # well below the uniform model's log |V|
    for which in ("u", "v", "u+v"):
        vec = word_vectors(model.u.detach().numpy(), model.v.detach().numpy(), which)
        unit = vec / np.linalg.norm(vec, axis=1, keepdims=True)
        sim = unit @ unit.T
        same = np.mean([sim[i, j] for i in range(8) for j in range(8) if i != j and i // 4 == j // 4])
        other = np.mean([sim[i, j] for i in range(8) for j in range(8) if i // 4 != j // 4])
        assert same > other + 0.3, which
    np.testing.assert_array_equal(word_vectors(np.ones((2, 2)), np.ones((2, 2)), "u+v"), 2 * np.ones((2, 2)))
    with pytest.raises(ParameterError, match="vectors"):
        word_vectors(np.ones((2, 2)), np.ones((2, 2)), "w")
