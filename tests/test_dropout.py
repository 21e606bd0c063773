"""models/dropout.py: the CPU mask drops each element with probability round(p · 2¹⁵) / 2¹⁵, independently,
scales the kept ones so the expectation is the input's, draws from torch's seeded generator, and passes the
gradient through the same mask."""

from __future__ import annotations

import pytest
import torch
from lexiflow.models.dropout import Dropout, dropout
from lexiflow.models.encoder import EncoderConfig, EncoderModel
from lexiflow.models.finetune import Classifier, set_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_drop_rate_is_p_and_the_kept_are_scaled_to_keep_the_mean(p):
    torch.manual_seed(0)
    n = 400_000
    y = dropout(torch.ones(n), p)
    dropped = float((y == 0).float().mean())
    assert abs(dropped - p) < 4 * (p * (1 - p) / n) ** 0.5  # 4 standard errors of a binomial share
    m = round(p * 2**15)
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 2**15 / (2**15 - m)))  # 1 / (1 - realized rate)


def test_neighbouring_elements_are_independent():
    """Four 15-bit uniforms come from one 64-bit draw: each lane of the four must drop at p, and a lane's drop
    must not predict its neighbour's (in a tensor of odd size too, where the last draw is part used)."""
    torch.manual_seed(1)
    y = dropout(torch.ones(4 * 100_001 + 3), 0.5)[:-3].view(-1, 4) == 0
    for lane in range(4):
        assert abs(float(y[:, lane].float().mean()) - 0.5) < 0.01
    both = float((y[:, 0] & y[:, 1]).float().mean())
    assert abs(both - 0.25) < 0.01


def test_the_mask_is_seeded_and_the_gradient_goes_through_it():
    x = torch.randn(3, 5, 7, requires_grad=True)
    torch.manual_seed(2)
    y = dropout(x, 0.3)
    torch.manual_seed(2)
    assert torch.equal(dropout(x, 0.3), y)
    y.sum().backward()
    kept = y != 0
    scale = 2**15 / (2**15 - round(0.3 * 2**15))
    assert torch.allclose(x.grad, kept.float() * scale)
    assert torch.allclose(y[kept], x[kept] * scale)


def test_edges_and_evaluation_leave_the_input_or_zero_it():
    x = torch.randn(4, 6)
    assert dropout(x, 0.0) is x and dropout(x, 0.5, training=False) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    layer = Dropout(0.5).eval()
    assert layer(x) is x
    assert dropout(x.to(torch.bfloat16), 0.5).dtype == torch.bfloat16


def test_the_models_dropouts_are_nn_dropouts_that_fine_tuning_can_reset():
    body = EncoderModel(EncoderConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8,
                                      dropout=0.1))
    model = Classifier(body, "token", 3)
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(isinstance(m, Dropout) for m in drops)
    set_dropout(body, 0.0)
    model.train()
    ids = torch.randint(5, 50, (2, 8))
    assert torch.equal(body(ids), body(ids))  # no dropout left in the body: two passes agree
