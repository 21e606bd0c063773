"""Transformer building blocks (Vaswani et al. 2017; notes 000 "Transformer Encoder/Decoder", 002 §4-8), shared
by the encoder–decoder translator and the encoder-only models (BERT).

    embeddings:     x = E[token] * sqrt(d) + PE[position]          (sinusoidal, fixed; or learned)
    encoder layer:  x = Sub(x, self-attention, padding mask);  x = Sub(x, FFN)
    decoder layer:  y = Sub(y, masked self-attention);  y = Sub(y, cross-attention to the encoder);  y = Sub(y, FFN)
    FFN:            Linear(d, d_ff) -> ReLU | GELU -> Linear(d_ff, d)

Sub(x, f) is the notes' "Add & Norm" LayerNorm(x + f(x)) with norm="post", or x + f(LayerNorm(x)) with
norm="pre" (GPT-2; trains without warmup; the stack then ends with one more LayerNorm).
Masks: padding masks are (B, T) booleans, True = real token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from lexiflow.models.attention import MultiHeadAttention
from lexiflow.models.dropout import Dropout
from lexiflow.models.errors import ParameterError
from torch import nn

NORMS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu")
POSITIONALS = ("sinusoidal", "learned")


@dataclass
class BlockConfig:
    """The sizes and choices every layer of a stack shares."""

    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    norm: str = "post"  # "post": the notes' LayerNorm(x + Sublayer(x)); "pre": x + Sublayer(LayerNorm(x))
    activation: str = "relu"  # "relu" (Vaswani) | "gelu" (BERT, GPT)

    def validate(self) -> None:
        if self.d_model < 1 or self.n_heads < 1 or self.d_ff < 1:
            raise ParameterError("d_model, n_heads and d_ff must be 1 or more")
        if self.d_model % self.n_heads:
            raise ParameterError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.norm not in NORMS:
            raise ParameterError(f"norm={self.norm!r}: use 'post' or 'pre'")
        if self.activation not in ACTIVATIONS:
            raise ParameterError(f"activation={self.activation!r}: use 'relu' or 'gelu'")
        if not 0.0 <= self.dropout < 1.0:
            raise ParameterError(f"dropout={self.dropout}: use a value in [0, 1)")


def sinusoidal_positions(n: int, d: int) -> torch.Tensor:
    """(n, d) table: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    inv = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float32) / d)  # (ceil(d/2),)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)[:, : d // 2]
    return pe


class Embeddings(nn.Module):
    """Token embedding plus position: E[x] * sqrt(d) + PE (Vaswani §3.4-3.5) for sinusoidal positions
    (tokens initialised N(0, 1/d) so both terms start at unit scale), E[x] + P[position] for learned ones."""

    def __init__(self, vocab_size: int, d_model: int, max_len: int, positional: str = "sinusoidal",
                 dropout: float = 0.1) -> None:
        super().__init__()
        if positional not in POSITIONALS:
            raise ParameterError(f"positional={positional!r}: use 'sinusoidal' or 'learned'")
        self.max_len = max_len
        self.token = nn.Embedding(vocab_size, d_model)
        if positional == "learned":
            self.pos = nn.Embedding(max_len, d_model)
            nn.init.normal_(self.pos.weight, std=0.02)
            nn.init.normal_(self.token.weight, std=0.02)
            self.scale = 1.0
        else:
            self.register_buffer("pe", sinusoidal_positions(max_len, d_model), persistent=False)
            nn.init.normal_(self.token.weight, std=d_model**-0.5)
            self.scale = math.sqrt(d_model)
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:  # (B, T) ids -> (B, T, D)
        T = x.shape[1]
        if offset + T > self.max_len:
            raise ParameterError(f"sequence of {offset + T} tokens exceeds max_len={self.max_len}")
        pos = self.pos.weight[offset:offset + T] if hasattr(self, "pos") else self.pe[offset:offset + T]
        return self.drop(self.token(x) * self.scale + pos)


class FeedForward(nn.Sequential):
    """Position-wise FFN: Linear(d, d_ff) -> activation -> Linear(d_ff, d)."""

    def __init__(self, c: BlockConfig) -> None:
        act = nn.ReLU() if c.activation == "relu" else nn.GELU()
        super().__init__(nn.Linear(c.d_model, c.d_ff), act, Dropout(c.dropout), nn.Linear(c.d_ff, c.d_model))


class Sublayer(nn.Module):
    """Residual + LayerNorm around one sublayer f: post LN(x + drop(f(x))), pre x + drop(f(LN(x)))."""

    def __init__(self, c: BlockConfig) -> None:
        super().__init__()
        self.pre = c.norm == "pre"
        self.norm = nn.LayerNorm(c.d_model)
        self.drop = Dropout(c.dropout)

    def forward(self, x: torch.Tensor, f) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, weights = f(self.norm(x) if self.pre else x)
        y = x + self.drop(out)
        return (y if self.pre else self.norm(y)), weights


class EncoderLayer(nn.Module):
    """Unmasked self-attention over the real tokens (padding keys masked), then the FFN."""

    def __init__(self, c: BlockConfig) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout)
        self.ffn = FeedForward(c)
        self.sub_attn, self.sub_ffn = Sublayer(c), Sublayer(c)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, weights = self.sub_attn(x, lambda h: self.attn(h, mask=pad_mask, need_weights=need_weights))
        x, _ = self.sub_ffn(x, lambda h: (self.ffn(h), None))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked (causal) self-attention, cross-attention to the encoder output, then the FFN.
    forward returns (y, cross-attention weights (B, H, T_tgt, T_src) when asked)."""

    def __init__(self, c: BlockConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout)
        self.ffn = FeedForward(c)
        self.sub_self, self.sub_cross, self.sub_ffn = Sublayer(c), Sublayer(c), Sublayer(c)

    def forward(self, y: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                tgt_mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, _ = self.sub_self(y, lambda h: self.self_attn(h, mask=tgt_mask, causal=True))
        y, weights = self.sub_cross(y, lambda h: self.cross_attn(h, memory, mask=memory_mask,
                                                                 need_weights=need_weights))
        y, _ = self.sub_ffn(y, lambda h: (self.ffn(h), None))
        return y, weights


class Encoder(nn.Module):
    """n encoder layers (+ a final LayerNorm under pre-norm). forward(x (B, T, D), pad_mask (B, T))."""

    def __init__(self, c: BlockConfig, n_layers: int) -> None:
        super().__init__()
        c.validate()
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(c.d_model) if c.norm == "pre" else nn.Identity()

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x, _ = layer(x, pad_mask)
        return self.final_norm(x)


class Decoder(nn.Module):
    """n decoder layers (+ a final LayerNorm under pre-norm). forward returns (y, the last layer's
    cross-attention weights averaged over heads (B, T_tgt, T_src), when asked)."""

    def __init__(self, c: BlockConfig, n_layers: int) -> None:
        super().__init__()
        c.validate()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(c.d_model) if c.norm == "pre" else nn.Identity()

    def forward(self, y: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                tgt_mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        weights = None
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            y, w = layer(y, memory, memory_mask, tgt_mask, need_weights and last)
            weights = w.mean(dim=1) if w is not None else weights
        return self.final_norm(y), weights
