"""Attention, the one module every model shares (seq2seq RNNs, the encoder–decoder Transformer, BERT).

The notes' recipe (002 §3, 004 "Attention Mechanism"): scores e_ij = score(query_i, key_j), weights
α_i = softmax(e_i) over the keys a query may see, context c_i = Σ_j α_ij v_j.

- `scaled_dot_product_attention`: e = q·k / sqrt(d_k) on (..., T, d) tensors (Vaswani et al. 2017),
  with a padding/visibility mask and an optional causal mask (the decoder's "no peeking ahead").
- Score functions for RNN encoder–decoders (Luong et al. 2015; Bahdanau et al. 2015), each a small
  nn.Module returning (context, weights): `DotAttention` s·h, `GeneralAttention` (bilinear) sᵀW h,
  `AdditiveAttention` (MLP, "Bahdanau") vᵀ tanh(W s + U h).
- `MultiHeadAttention`: h heads of scaled dot-product attention on learned projections, self or
  cross (keys/values from another sequence), concatenated and projected by W^O (002 §3.b).

Masks are boolean with True = may attend, broadcastable to the weights' shape (..., T_q, T_k). A query
that may attend to nothing (a fully masked row) gets all-zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lexiflow.models.dropout import dropout
from lexiflow.models.errors import ParameterError
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | None = None) -> torch.Tensor:
    """(T_q, T_k) boolean, True on and below the diagonal: query i sees keys j <= i (aligned at the end
    when T_k > T_q, as for a decoder continuing a prefix)."""
    t_k = t_q if t_k is None else t_k
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last axis, masked entries weigh exactly 0; a fully masked row is all zeros.

    The masked scores are set to the dtype's most negative finite value rather than -inf: exp(min - max)
    underflows to exactly 0 next to any real score, and a row with no real score stays finite (uniform),
    which the final multiply by the mask then zeroes.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
    return weights * mask


def _combine(mask: torch.Tensor | None, causal: bool, t_q: int, t_k: int, device: torch.device) -> torch.Tensor | None:
    if not causal:
        return mask
    c = causal_mask(t_q, t_k, device)
    return c if mask is None else mask & c


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                                 causal: bool = False, dropout_p: float = 0.0,
                                 scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(d_k) [masked]) v on q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v).

    Returns (output (..., T_q, d_v), weights (..., T_q, T_k)); the weights returned are before dropout.
    `scale` overrides 1/sqrt(d_k) (the notes' exercise 001 uses 1/d_k).
    """
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ParameterError(f"attention shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                             "q and k need the same last size, k and v the same length")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    weights = masked_softmax(scores, _combine(mask, causal, q.shape[-2], k.shape[-2], q.device))
    dropped = dropout(weights, dropout_p)
    return torch.matmul(dropped.to(v.dtype), v), weights


class ScoreAttention(nn.Module):
    """Attention of one decoder state over the encoder states: weights α = softmax(score(s, h_j)), context
    c = Σ_j α_j h_j. Subclasses define `score`; `prepare(keys)` precomputes what depends on the keys only
    (once per source sentence, not once per decoding step).

    forward(query (B, d_q) or (B, T_q, d_q), keys (B, T_k, d_k), mask (B, T_k) True = real token)
    -> (context (B, [T_q,] d_k), weights (B, [T_q,] T_k)).
    """

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return keys

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:  # (B, T_q, T_k)
        raise NotImplementedError

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None,
                prepared: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        single = query.dim() == 2
        q = query.unsqueeze(1) if single else query  # (B, T_q, d_q)
        scores = self.score(q, self.prepare(keys) if prepared is None else prepared)
        weights = masked_softmax(scores, None if mask is None else mask[:, None, :])
        context = torch.bmm(weights.to(keys.dtype), keys)  # (B, T_q, d_k): c_i = Σ_j α_ij h_j
        return (context.squeeze(1), weights.squeeze(1)) if single else (context, weights)


class DotAttention(ScoreAttention):
    """score(s, h) = s · h (Luong "dot"; 001's encoder–decoder with attention). Needs d_q == d_k."""

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return torch.bmm(query, prepared.transpose(1, 2))


class GeneralAttention(ScoreAttention):
    """score(s, h) = sᵀ W h (bilinear, Luong "general"); W h is precomputed per source."""

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__()
        self.W = nn.Linear(key_size, query_size, bias=False)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.W(keys)  # (B, T_k, d_q)

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return torch.bmm(query, prepared.transpose(1, 2))


class AdditiveAttention(ScoreAttention):
    """score(s, h) = vᵀ tanh(W s + U h) (MLP, Bahdanau et al. 2015; 004); U h is precomputed per source."""

    def __init__(self, query_size: int, key_size: int, hidden_size: int) -> None:
        super().__init__()
        self.W = nn.Linear(query_size, hidden_size, bias=False)
        self.U = nn.Linear(key_size, hidden_size)
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.U(keys)  # (B, T_k, H)

    def score(self, query: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.W(query)[:, :, None, :] + prepared[:, None, :, :])  # (B, T_q, T_k, H)
        return self.v(hidden).squeeze(-1)


SCORES = ("dot", "general", "additive")


def make_score_attention(kind: str, query_size: int, key_size: int, hidden_size: int | None = None) -> ScoreAttention:
    """`kind` is one of SCORES; the additive MLP's hidden size defaults to the query size."""
    if kind == "dot":
        if query_size != key_size:
            raise ParameterError(f"attention='dot' needs equal decoder and encoder state sizes, got {query_size} "
                                 f"and {key_size}: use 'general' or 'additive' (or a unidirectional encoder)")
        return DotAttention()
    if kind == "general":
        return GeneralAttention(query_size, key_size)
    if kind == "additive":
        return AdditiveAttention(query_size, key_size, hidden_size or query_size)
    raise ParameterError(f"attention={kind!r}: use one of {', '.join(SCORES)} (or 'none')")


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(X W_i^Q, Z W_i^K, Z W_i^V) with
    Z = X (self-attention) or another sequence (cross-attention). d_model is split evenly over the heads.

    forward(x (B, T_q, D), memory (B, T_k, D) or None, mask broadcastable to (B, H, T_q, T_k) or a (B, T_k)
    key-padding mask, causal) -> (output (B, T_q, D), weights (B, H, T_q, T_k) or None).
    Without `need_weights` it uses torch's fused kernel (same function, no weights materialised).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ParameterError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads, self.dropout = n_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's MultiheadAttention init: xavier-uniform over the stacked (3D, D) in-projection [W^Q; W^K; W^V],
        zero biases; W^O keeps nn.Linear's weight init. (nn.Linear's default adds random biases every token shares.)"""
        w = torch.empty(3 * self.q_proj.out_features, self.q_proj.in_features)
        nn.init.xavier_uniform_(w)
        with torch.no_grad():
            for proj, part in zip((self.q_proj, self.k_proj, self.v_proj), w.chunk(3), strict=True):
                proj.weight.copy_(part)
            for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
                if proj.bias is not None:
                    proj.bias.zero_()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, D/H)
        B, T, D = x.shape
        return x.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                causal: bool = False, need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        z = x if memory is None else memory
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(z)), self._heads(self.v_proj(z))
        if mask is not None and mask.dim() == 2:  # (B, T_k) key padding -> (B, 1, 1, T_k)
            mask = mask[:, None, None, :]
        p = self.dropout if self.training else 0.0
        if need_weights or (p > 0 and q.device.type == "cpu"):  # torch's kernels draw the CPU dropout slowly
            y, weights = scaled_dot_product_attention(q, k, v, mask, causal, p)
        elif mask is None and (not causal or q.shape[-2] == k.shape[-2]):  # flash kernel: no mask tensor at all
            y, weights = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal), None
        else:
            y, weights = _fused_attention(q, k, v, _combine(mask, causal, q.shape[-2], k.shape[-2], q.device), p), None
        B, _, T, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1)), weights if need_weights else None


# Every fused kernel but cuDNN's for masked attention: in bf16 on H100/H200 (the default backend since torch 2.11)
# its backward returns NaN query gradients for some masked shapes (pytorch/pytorch#196678); it diverged the
# encoder's MLM pretraining in bf16, while fp32 (which cuDNN's kernel does not take) trained through.
MASKED_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     dropout_p: float) -> torch.Tensor:
    """torch's fused softmax(q kᵀ/sqrt(d)) v (memory-efficient kernel on CUDA) under a mask. The mask goes in
    as a finite additive bias so a fully masked row cannot produce NaN, and such rows are zeroed after."""
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, torch.finfo(q.dtype).min)
    with sdpa_kernel(MASKED_KERNELS):
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    return y * mask.any(dim=-1, keepdim=True).to(y.dtype)
