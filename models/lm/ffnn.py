"""Feed-forward neural LM (Bengio, Ducharme, Vincent & Jauvin 2003, "A Neural Probabilistic Language Model").

P(w_t | w_{t-n+1} .. w_{t-1}) = softmax(U tanh(H [C(w_{t-n+1}); ..; C(w_{t-1})] + d) + b)
(`ffnn_activation="sigmoid"`, `ffnn_bias=False`: the notes' (003) h = σ(W e), z = U h):
the embeddings C of the n-1 previous tokens are concatenated, pass one tanh hidden layer, then a
softmax over the vocabulary (the paper's optional direct input->output connections are left out).

Like an n-gram model, the context never crosses a sentence start: tokens before the latest `<s>`
in the window are replaced by `<s>`, so the first word of a sentence sees `<s> .. <s>` whether it is
scored alone or inside a stream. The carried "state" is simply the last n-2 tokens of the previous
window, which lets the shared stream training loop (`models.lm.train`) feed it bptt windows.
"""

from __future__ import annotations

import torch
from lexiflow.models.lm.config import FFNNConfig
from lexiflow.models.lm.module import LMModule, State
from lexiflow.models.lm.neural import NeuralLM
from torch import nn


class FFNN(LMModule):
    def __init__(self, config: FFNNConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        k, d = config.context_size, config.emb_dim
        self.embedding = nn.Embedding(config.vocab_size, d)  # C in the paper
        self.hidden = nn.Linear(k * d, config.hidden_dim, bias=config.ffnn_bias)  # H, d (the notes' W)
        self.activation = torch.tanh if config.ffnn_activation == "tanh" else torch.sigmoid
        self.drop = nn.Dropout(config.dropout)
        self.output = nn.Linear(config.hidden_dim, config.vocab_size, bias=config.ffnn_bias)  # U, b
        nn.init.normal_(self.embedding.weight, std=0.1)

    def contexts(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids -> (B, T, k) context windows ending at each position (sentence-bounded), new tail."""
        k, bos = self.config.context_size, self.config.bos_id
        b = x.shape[0]
        tail = state[0] if state is not None else torch.full((b, k - 1), bos, dtype=x.dtype, device=x.device)
        full = torch.cat([tail, x], dim=1)  # (B, k-1+T)
        ctx = full.unfold(1, k, 1)  # (B, T, k): ctx[:, t] = full[:, t : t+k], ends at x[:, t]
        is_bos = ctx == bos
        # A token is cut off when a <s> follows it inside the window: count <s> strictly to its right.
        later_bos = is_bos.flip(-1).cumsum(-1).flip(-1) - is_bos.long()
        ctx = ctx.masked_fill(later_bos > 0, bos)
        return ctx, full[:, full.shape[1] - (k - 1) :]

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        ctx, tail = self.contexts(x, state)  # (B, T, k), (B, k-1)
        e = self.embedding(ctx).flatten(2)  # (B, T, k*d)
        h = self.drop(self.activation(self.hidden(e)))  # (B, T, hidden)
        return self.output(h), (tail,)  # (B, T, V)


class FFNNLM(NeuralLM):
    """Bengio et al. (2003) feed-forward LM as an estimator: `FFNNLM(FFNNConfig(V)).fit(sentences)`."""

    kind = "ffnn"
    config_class = FFNNConfig

    def _build(self) -> FFNN:
        return FFNN(self.config)
