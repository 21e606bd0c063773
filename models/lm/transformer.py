"""GPT-style Transformer decoder LM (Vaswani et al. 2017, "Attention Is All You Need"; Radford et al.
2018/2019, GPT / GPT-2), after nanoGPT's `model.py`.

    x = token embedding + position embedding (sinusoidal, Vaswani §3.5, or learned)
    for each layer:  x = x + MHA(LN(x))   (causal, scaled dot product via F.scaled_dot_product_attention)
                     x = x + FFN(LN(x))   (Linear d -> 4d, GELU, Linear 4d -> d)
    logits = LN(x) @ E^T                  (weight tying: the output matrix is the token embedding)

Pre-LayerNorm (GPT-2) keeps training stable without long warmup. Initialisation follows GPT-2:
N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers). The model has no recurrent state:
each bptt window (at most `max_len` tokens) is attended to on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm.neural import LMConfig, LMModule, NeuralLM, State, TieWeights
from lexiflow.models.transformer_blocks import sinusoidal_positions
from pydantic import Field
from torch import nn


@dataclass
class TransformerConfig(LMConfig):
    vocab_size: int
    d_model: Annotated[int, Field(ge=8, le=8192, description="Transformer width.")] = 128
    n_layers: Annotated[int, Field(ge=1, le=48, description="Transformer blocks.")] = 2
    n_heads: Annotated[int, Field(ge=1, le=64, description="Transformer attention heads (divide d_model).")] = 4
    max_len: Annotated[int, Field(ge=8, le=8192, description="Transformer context window.")] = 128
    positional: Annotated[Literal["sinusoidal", "learned"], Field(description="Transformer positions.")] = "sinusoidal"
    tie_weights: TieWeights = True

    def validate(self) -> None:
        super().validate()
        if self.d_model % self.n_heads:
            raise ParameterError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")


def count_parameters(c: TransformerConfig) -> int:
    """Closed form: V d (+ V d untied head) (+ max_len d learned positions) + L (12 d^2 + 13 d) + 2 d."""
    d = c.d_model
    n = c.vocab_size * d * (1 if c.tie_weights else 2) + c.n_layers * (12 * d * d + 13 * d) + 2 * d
    return n + (c.max_len * d if c.positional == "learned" else 0)


class CausalSelfAttention(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.n_heads, self.dropout = c.n_heads, c.dropout
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.resid_drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)  # each (B, T, D)
        q, k, v = (t.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        # softmax(q k^T / sqrt(hd) + causal mask) v, fused (flash / memory-efficient kernels on CUDA)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model)
        self.attn = CausalSelfAttention(c)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.ffn = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(), nn.Linear(4 * c.d_model, c.d_model),
                                 nn.Dropout(c.dropout))  # d_ff = 4d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class Transformer(LMModule):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.max_context = config.max_len
        V, D = config.vocab_size, config.d_model
        self.embedding = nn.Embedding(V, D)  # token embedding (wte)
        if config.positional == "learned":
            self.pos = nn.Embedding(config.max_len, D)
        else:
            self.register_buffer("pe", sinusoidal_positions(config.max_len, D), persistent=False)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.apply(self._init)
        # Vaswani §3.4: with fixed sinusoids (unit scale) the token embeddings are scaled by sqrt(d); init them
        # N(0, 1/d) so both terms start at unit scale (else the positions drown the tokens).
        self.emb_scale = math.sqrt(D) if config.positional == "sinusoidal" else 1.0
        if config.positional == "sinusoidal":
            nn.init.normal_(self.embedding.weight, std=D**-0.5)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("ffn.2.weight"):  # residual outputs (GPT-2 scaling)
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layers))
        if config.tie_weights:
            self.lm_head.weight = self.embedding.weight  # E = V^T

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        B, T = x.shape
        if T > self.config.max_len:
            raise ParameterError(f"window of {T} tokens exceeds max_len={self.config.max_len}")
        pos = self.pos.weight[:T] if self.config.positional == "learned" else self.pe[:T]  # (T, D)
        h = self.drop(self.embedding(x) * self.emb_scale + pos)  # (B, T, D)
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h)), None  # (B, T, V)


class TransformerLM(NeuralLM):
    """GPT-style decoder LM estimator: `TransformerLM(TransformerConfig(V), TrainConfig(...)).fit(sentences)`."""

    kind = "transformer"
    config_class = TransformerConfig

    def _build(self) -> Transformer:
        return Transformer(self.config)
