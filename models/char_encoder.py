"""Character-level word encoder (a char CNN with max-pooling over time, Ma & Hovy 2016; ELMo's token
encoder, Peters et al. 2018): a vector for any word form, seen or not, from its spelling.

Char ids: 0 pad, 1 unknown char, 2 begin-of-word, 3 end-of-word, 4 and 5 the sentence-boundary
tokens `<s>`, `</s>` (one char each), then the characters seen in training. A word longer than
`max_chars` keeps its first and last `max_chars // 2` characters (prefixes and suffixes carry the
morphology).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn

PAD, UNK_CHAR, BOW, EOW, BOS_TOKEN, EOS_TOKEN = range(6)
SPECIAL_TOKENS = {"<s>": BOS_TOKEN, "</s>": EOS_TOKEN}  # only as boundary tokens, never from text


class CharVocab:
    def __init__(self, chars: Sequence[str], max_chars: int = 24) -> None:
        self.chars = list(chars)
        self.index = {c: i + 6 for i, c in enumerate(self.chars)}
        self.max_chars = max_chars
        self._cache: dict[str, np.ndarray] = {}

    @classmethod
    def build(cls, words: Iterable[str], min_count: int = 1, max_chars: int = 24) -> CharVocab:
        counts = Counter(c for w in words for c in w)
        return cls(sorted(c for c, n in counts.items() if n >= min_count), max_chars)

    def __len__(self) -> int:
        return len(self.chars) + 6

    def word_ids(self, word: str) -> np.ndarray:
        ids = self._cache.get(word)
        if ids is None:
            body = word if len(word) <= self.max_chars else word[: self.max_chars // 2] + word[-(self.max_chars // 2):]
            ids = np.array([BOW, *(self.index.get(c, UNK_CHAR) for c in body), EOW], dtype=np.int64)
            self._cache[word] = ids
        return ids

    def encode(self, words: Sequence[str], boundary: bool = False) -> torch.Tensor:
        """(N, max length + 2) char ids, right-padded with 0. `boundary`: the words `<s>`/`</s>` are the
        sentence-boundary tokens (a biLM's input), not text."""
        rows = [np.array([SPECIAL_TOKENS[w]]) if boundary and w in SPECIAL_TOKENS else self.word_ids(w) for w in words]
        out = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return torch.from_numpy(out)


class CharCNN(nn.Module):
    """(N, C) char ids -> (N, filters * len(kernels)): one conv per width, max over positions (padding
    masked out, so a word's vector does not depend on how long the other words of its batch are)."""

    def __init__(self, n_chars: int, char_dim: int = 32, filters: int = 64, kernels: Sequence[int] = (2, 3, 4)) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_chars, char_dim, padding_idx=PAD)
        self.convs = nn.ModuleList(nn.Conv1d(char_dim, filters, k, padding=k - 1) for k in kernels)
        self.out_dim = filters * len(kernels)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        mask = chars != PAD  # (N, C)
        x = self.embedding(chars).transpose(1, 2)  # (N, char_dim, C)
        outs = []
        for conv in self.convs:
            # Output p is the window ending at char p (zero-padded on the left); windows ending at a real
            # char hold only real chars and that zero padding, never the batch's right padding.
            h = torch.tanh(conv(x))[:, :, : chars.shape[1]]  # (N, F, C)
            outs.append(h.masked_fill(~mask[:, None, :], -2.0).amax(dim=2))  # tanh > -2: a pad never wins
        return torch.cat(outs, dim=1)


class CharBiLSTM(nn.Module):
    """(N, C) char ids -> (N, 2 * hidden): the last states of a forward and a backward LSTM over the
    word's characters (Plank et al. 2016; Lample et al. 2016): the forward one ends on the suffix, the
    backward one on the prefix. Packed, so padding never changes a word's vector."""

    def __init__(self, n_chars: int, char_dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_chars, char_dim, padding_idx=PAD)
        self.lstm = nn.LSTM(char_dim, hidden, batch_first=True, bidirectional=True)
        self.out_dim = 2 * hidden

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        lengths = (chars != PAD).sum(dim=1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(chars), lengths, batch_first=True,
                                                   enforce_sorted=False)
        _, (h, _) = self.lstm(packed)  # h: (2, N, hidden), the last state of each direction
        return torch.cat([h[0], h[1]], dim=1)
