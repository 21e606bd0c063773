"""The network every neural LM implements (`LMModule`) and the state it carries: shared by the estimators
(`models.lm.neural`) and the training loop (`models.lm.train`), which import it, not each other."""

from __future__ import annotations

import torch
from torch import nn

State = tuple[torch.Tensor, ...] | None


class LMModule(nn.Module):
    """Interface of a neural LM network.

    forward(x: (B, T) int64, state) -> (logits (B, T, V), new state); state None means "start of
    stream". `max_context` is the longest window the module accepts (None: unbounded).
    """

    max_context: int | None = None
    state_batch_dim: int = 0  # the batch dimension of each carried state tensor (RNNs: 1)
    embedding: nn.Embedding

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:  # pragma: no cover
        raise NotImplementedError
