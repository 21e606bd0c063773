"""Dropout with a cheaper mask on the CPU.

torch draws a CPU dropout mask with `bernoulli_`, one Mersenne-Twister draw per element: with the multiplies
around it, dropout was a third of the encoder's training step on one CPU thread (d 128, 2 layers: the finetune
benchmark's). Here each 64-bit draw of the same generator (63 random bits) gives four 15-bit uniforms, and an
element is dropped when its uniform falls below m = round(p · 2¹⁵): a drop rate m / 2¹⁵ within 2⁻¹⁶ of p, the
kept elements scaled by 1 / (1 - m / 2¹⁵), so the expectation is exactly the input's. Seeded by
`torch.manual_seed` like any other draw. Other devices keep torch's kernel (its draws are cheap there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 15  # a uniform's values: 15 bits


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout(x, p, training), with the cheaper mask on the CPU."""
    if not training or p <= 0:
        return x
    if x.device.type != "cpu" or p >= 1:
        return F.dropout(x, p, True)
    m = round(p * _LEVELS)
    if m == 0:
        return x
    n = x.numel()
    words = torch.empty(-(-n // 4), dtype=torch.int64).random_()  # [0, 2⁶³): each 16-bit lane's low 15 bits
    keep = ((words.view(torch.int16)[:n] & (_LEVELS - 1)) >= m).view(x.shape)
    return x * keep.to(x.dtype).mul_(_LEVELS / (_LEVELS - m))  # one float mask: x * bool would cast it twice


class Dropout(nn.Dropout):
    """nn.Dropout with `dropout`'s mask (an nn.Dropout still: code that finds or resets dropouts finds it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
