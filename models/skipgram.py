"""Skip-gram with the full softmax, as the midterm review (notes 000, "Word Embeddings") derives it:

    P(c | t) = exp(u_t · v_c) / Σ_k exp(u_t · v_k),    y = -log P(c | t)
    ∂y/∂u_t = -v_c + Σ_k P(k | t) v_k,    ∂y/∂v_k = (P(k | t) - 1) u_t if k = c, else P(k | t) u_t

Two vector sets: u (a word as the center, `input`) and v (a word as context, `output`); the embeddings
are u (the usual choice), v, or u + v (`word_vectors`). Every step touches all |V| output vectors,
which is why word2vec proper uses negative sampling (`models.word2vec`, gensim): this one is for
small vocabularies and for teaching; it trains with plain SGD on the mean loss over (center, context)
pairs within `window` words.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.word2vec_config import Which
from torch import nn


class SkipGramSoftmax(nn.Module):
    def __init__(self, vocab_size: int, dim: int, seed: int = 0) -> None:
        super().__init__()
        if vocab_size < 2 or dim < 1:
            raise ParameterError(f"skip-gram vocab_size={vocab_size}, dim={dim}: need at least 2 words and 1 dim")
        g = torch.Generator().manual_seed(seed)
        self.u = nn.Parameter((torch.rand(vocab_size, dim, generator=g) - 0.5) / dim)  # word2vec's init
        self.v = nn.Parameter((torch.rand(vocab_size, dim, generator=g) - 0.5) / dim)

    def forward(self, centers: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """Mean of y = -log P(context | center) over the pairs."""
        return F.cross_entropy(self.u[centers] @ self.v.T, contexts)


def closed_form_gradients(u_t: torch.Tensor, v: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The review's ∂y/∂u_t (d,) and ∂y/∂v_k for every k (|V|, d) of one pair (t, c)."""
    p = torch.softmax(v @ u_t, dim=0)  # P(k | t)
    grad_v = p[:, None] * u_t[None, :]
    grad_v[c] -= u_t
    return -v[c] + p @ v, grad_v


def pairs(sentences: Sequence[Sequence[int]], window: int) -> tuple[np.ndarray, np.ndarray]:
    """(center, context) ids of every context word within `window` positions, sentence by sentence."""
    if window < 1:
        raise ParameterError(f"skip-gram window={window}: must be at least 1")
    centers, contexts = [], []
    for s in sentences:
        s = np.asarray(s, dtype=np.int64)
        for j in range(1, window + 1):
            if len(s) > j:
                centers += [s[:-j], s[j:]]
                contexts += [s[j:], s[:-j]]
    if not centers:
        raise InputError("skip-gram: no sentence has two words, so there is no (center, context) pair")
    return np.concatenate(centers), np.concatenate(contexts)


def train(sentences: Sequence[Sequence[int]], vocab_size: int, dim: int = 50, window: int = 2, epochs: int = 5,
          lr: float = 0.5, batch_size: int = 256, seed: int = 0) -> tuple[SkipGramSoftmax, list[float]]:
    """SGD on the full-softmax loss; returns the model and the mean loss of each epoch."""
    t, c = (torch.from_numpy(a) for a in pairs(sentences, window))
    if int(max(t.max(), c.max())) >= vocab_size:
        raise InputError(f"skip-gram: token id {int(max(t.max(), c.max()))} is outside vocab_size={vocab_size}")
    model = SkipGramSoftmax(vocab_size, dim, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    history = []
    for _ in range(epochs):
        order, total = torch.randperm(len(t), generator=g), 0.0
        for start in range(0, len(t), batch_size):
            idx = order[start:start + batch_size]
            loss = model(t[idx], c[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        history.append(total / len(t))
    return model, history


def word_vectors(u: np.ndarray, v: np.ndarray, which: Which = "u") -> np.ndarray:
    """The embeddings from the two vector sets: u, v or u + v."""
    if which not in ("u", "v", "u+v"):
        raise ParameterError(f"vectors={which!r}: choose 'u' (input), 'v' (output) or 'u+v'")
    return u if which == "u" else v if which == "v" else u + v
