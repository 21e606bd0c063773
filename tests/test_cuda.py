"""The CUDA paths, on a machine with a GPU (skipped elsewhere: CI has none): `pytest tests/test_cuda.py`.

The rest of the suite's known answers are CPU fp32 numbers, so its models run on the CPU whatever the
machine; here they train on `cuda` with the default precision (bf16 autocast for the LMs), and are
held to what that precision allows: the same quality bars as on the CPU, probabilities that sum to 1,
and a saved model that scores like the one in memory."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from lexiflow.models.glove import GloVe
from lexiflow.models.lm import registry
from lexiflow.models.lm.rnn import RNNLM, RNNConfig
from lexiflow.models.lm.transformer import TransformerLM

from tests.test_lm_neural import BOS, TRAIN, VALID, V, quick, small_transformer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@pytest.mark.parametrize("make", [
    lambda: RNNLM(RNNConfig(V, cell="lstm", emb_dim=32, hidden_dim=32, num_layers=1, dropout=0.0, tie_weights=True),
                  quick(epochs=4, lr=3e-2, batch_size=4, device="cuda")),
    lambda: TransformerLM(small_transformer(positional="learned"),
                          quick(epochs=4, lr=1e-2, bptt=24, batch_size=4, device="cuda")),
])
def test_an_lm_trains_on_cuda_to_the_cpu_bar_and_its_saved_copy_scores_alike(tmp_path, make):
    lm = make().fit(TRAIN, VALID)
    assert next(lm.module_.parameters()).device.type == "cuda"
    assert lm.perplexity(VALID) < 6.0  # test_learns_the_successor_language's bar (unigram: ~30)
    probs = np.exp(lm.log_probs([BOS, 5, 6]))
    assert abs(probs.sum() - 1.0) < 1e-3 and probs.argmax() == 7  # next = previous + 1
    lm.save(tmp_path)
    back = registry.load(tmp_path)
    assert back.perplexity(VALID) == pytest.approx(lm.perplexity(VALID), rel=2e-2)  # bf16 either side


def test_glove_trains_on_cuda_like_on_the_cpu():
    # A random symmetric count matrix: the same seed on both devices; CUDA adds atomically, so the runs
    # agree to rounding, not bit for bit.
    counts = sp.random(300, 300, density=0.05, random_state=0, data_rvs=lambda n: np.ceil(np.random.default_rng(0)
                                                                                           .pareto(1.5, n) + 1))
    counts = sp.csr_matrix(counts + counts.T)
    cuda = GloVe(dim=16, epochs=8, batch_size=1024, device="cuda", seed=0).fit(counts)
    cpu = GloVe(dim=16, epochs=8, batch_size=1024, device="cpu", seed=0).fit(counts)
    losses = [h["loss"] for h in cuda.history_]
    assert losses[-1] < 0.8 * losses[0] and np.isfinite(cuda.vectors_).all()  # CPU: 1.09 -> 0.76
    assert losses[-1] == pytest.approx(cpu.history_[-1]["loss"], rel=0.05)
