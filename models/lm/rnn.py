"""Recurrent LMs: Elman RNN (Elman 1990; Mikolov et al. 2010), LSTM (Hochreiter & Schmidhuber 1997)
and GRU (Cho et al. 2014), in the regularised recipe of Zaremba, Sutskever & Vinyals (2014):

    embedding -> dropout -> stacked RNN (dropout between layers) -> dropout -> linear -> softmax

Weight tying (Press & Wolf 2017; Inan et al. 2017) makes the output matrix the embedding matrix
(E = V^T), which needs hidden_dim == emb_dim. Embeddings can start from a pretrained matrix and be
frozen (see `models.lm.neural.init_embeddings`); all 2 x 2 x 2 combinations of tying, pretrained
init and freezing are allowed. With tying, freezing the embedding freezes the output layer too.

The state (LSTM (h, c), GRU / Elman h; each (layers, B, hidden)) is what the training loop carries,
detached, across bptt windows (truncated backpropagation through time).
"""

from __future__ import annotations

import torch
from lexiflow.models.lm.config import RNNConfig
from lexiflow.models.lm.module import LMModule, State
from lexiflow.models.lm.neural import NeuralLM
from torch import nn

CELLS = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}




class RNN(LMModule):
    state_batch_dim = 1  # (layers, B, hidden)

    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        V, d, h = config.vocab_size, config.emb_dim, config.hidden_dim
        self.embedding = nn.Embedding(V, d)
        self.drop = nn.Dropout(config.dropout)
        # Time-major inside (the native layout of torch's RNN kernels; batch-first costs two transposes).
        self.rnn = CELLS[config.cell](d, h, num_layers=config.num_layers,
                                      dropout=config.dropout if config.num_layers > 1 else 0.0)
        self.decoder = nn.Linear(h, V)
        # Uniform(-0.1, 0.1) embeddings and decoder, zero bias: the word_language_model init.
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if config.tie_weights:
            self.decoder.weight = self.embedding.weight  # E = V^T: one (V, d) matrix

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        e = self.drop(self.embedding(x.t().contiguous()))  # (T, B, d)
        hx = None
        if state is not None:
            hx = state if self.config.cell == "lstm" else state[0]
        out, new = self.rnn(e, hx)  # (T, B, h); new: (h_n, c_n) or h_n, each (layers, B, h)
        logits = self.decoder(self.drop(out)).transpose(0, 1)  # (B, T, V), a view of time-major logits
        return logits, tuple(new) if isinstance(new, tuple) else (new,)


class RNNLM(NeuralLM):
    """Recurrent LM estimator: `RNNLM(RNNConfig(V, cell="gru"), TrainConfig(...)).fit(sentences)`."""

    kind = "rnn"
    config_class = RNNConfig

    def _build(self) -> RNN:
        return RNN(self.config)
