"""The data every neural LM trains and is scored on.

Data layout (shared by FFNN, RNN and Transformer LMs). A corpus is a list of sentences, each a 1-D
int array of token ids without boundary tokens. For training, sentences are concatenated into one
stream `<s> w1 .. wn </s> <s> v1 .. vm </s> ...` and cut into `batch_size` contiguous rows
(`batchify`, the word_language_model recipe of Zaremba et al. 2014); the loop walks windows of
`bptt` columns. Every position predicts the next token; targets that are `<s>` (deterministic after
`</s>`) or `<pad>` are ignored, so the loss and the perplexity count every word and every `</s>`,
never `<s>`/`<pad>`.

Truncated backpropagation through time (Williams & Peng 1990): the model's recurrent state
(LSTM (h, c), GRU/Elman h, the FFNN's last n-2 tokens) is carried from one window to the next and
detached, so gradients stop at the window edge while the forward pass sees the whole stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lexiflow.models.errors import InputError
from lexiflow.models.lm.module import LMModule
from lexiflow.models.lm.precision import autocast, dist_info

IGNORE = -100  # cross_entropy's ignore_index: targets that are <s> or <pad>


def flat_logits(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, V) logits and (B, T) targets as (N, V) and (N,), without copying the logits when a
    model computed them time-major and returned a transposed view (the recurrent LMs: cuDNN/CPU
    LSTMs run time-major, ~5% faster than batch-first)."""
    if not logits.is_contiguous() and logits.transpose(0, 1).is_contiguous():
        return logits.transpose(0, 1).reshape(-1, logits.shape[-1]), y.t().reshape(-1)
    return logits.reshape(-1, logits.shape[-1]), y.reshape(-1)


def to_stream(sentences: Sequence[np.ndarray], bos_id: int, eos_id: int, vocab_size: int,
              what: str = "sentences") -> np.ndarray:
    """Concatenate sentences as `<s> w1 .. wn </s>` into one int64 stream, checking ids."""
    if len(sentences) == 0:
        raise InputError(f"{what} is empty: give at least one sentence of token ids")
    parts: list[np.ndarray] = []
    for i, s in enumerate(sentences):
        a = np.asarray(s)
        if a.size and not np.issubdtype(a.dtype, np.integer):  # a float id would be truncated silently
            raise InputError(f"{what}: sentence {i} holds {a.dtype} values; give integer token ids")
        parts.append(np.concatenate(([bos_id], a.astype(np.int64).ravel(), [eos_id])))
    stream = np.concatenate(parts)
    lo, hi = int(stream.min()), int(stream.max())
    if lo < 0 or hi >= vocab_size:
        raise InputError(f"{what} holds token id {lo if lo < 0 else hi} outside [0, {vocab_size}): "
                         "encode with the vocabulary the model was configured for (vocab_size)")
    return stream


def batchify(stream: np.ndarray, batch_size: int) -> torch.Tensor:
    """(N,) stream -> (batch_size, N // batch_size): row b is the b-th contiguous slice."""
    n = len(stream) // batch_size
    if n < 2:
        raise InputError(f"the corpus has {len(stream)} tokens, too few for batch_size={batch_size}: "
                         "give more text or a smaller batch_size")
    return torch.from_numpy(stream[: n * batch_size].reshape(batch_size, n).copy())


def pad_sequences(seqs: Sequence[np.ndarray], pad_id: int) -> torch.Tensor:
    """Right-pad 1-D int arrays to (B, T_max) with pad_id."""
    t = max(len(s) for s in seqs)
    out = np.full((len(seqs), t), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return torch.from_numpy(out)


def windows(n_cols: int, bptt: int) -> Iterator[tuple[int, int]]:
    """(start, length) of the bptt windows over columns 0..n_cols-2 (each needs a next column); none for bptt 0."""
    for i in range(0, n_cols - 1, bptt) if bptt else ():
        yield i, min(bptt, n_cols - 1 - i)


def targets_of(y: torch.Tensor, bos_id: int, pad_id: int) -> torch.Tensor:
    """Targets with <s> and <pad> replaced by IGNORE (never counted)."""
    return y.masked_fill((y == bos_id) | (y == pad_id), IGNORE)


@torch.no_grad()
def evaluate(module: LMModule, data: torch.Tensor, window: int, device: torch.device, precision: str,
             bos_id: int, pad_id: int) -> tuple[float, int]:
    """Summed NLL (nats) and count of predicted tokens over (B, N) data, state carried across windows."""
    rank, world = dist_info()
    data = data[rank::world]  # data parallel: each rank scores every W-th row; the sums are added below
    was_training = module.training
    module.eval()
    state = None
    total, count = 0.0, 0
    for i, length in windows(data.shape[1], window if len(data) else 0):
        x = data[:, i : i + length].to(device)
        y = targets_of(data[:, i + 1 : i + 1 + length], bos_id, pad_id).to(device)
        with autocast(device, precision):
            logits, state = module(x, state)
        total += F.cross_entropy(*flat_logits(logits.float(), y),
                                 ignore_index=IGNORE, reduction="sum").item()
        count += int((y != IGNORE).sum())
    module.train(was_training)
    if world > 1:
        sums = torch.tensor([total, count], dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        total, count = float(sums[0]), int(sums[1])
    return total, count
