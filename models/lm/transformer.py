"""GPT-style Transformer decoder LM (Vaswani et al. 2017, "Attention Is All You Need"; Radford et al.
2018/2019, GPT / GPT-2), after nanoGPT's `model.py`.

    x = token embedding + position embedding (sinusoidal, Vaswani §3.5, or learned)
    for each layer:  x = x + MHA(LN(x))   (causal; models/attention.py's, F.scaled_dot_product_attention)
                     x = x + FFN(LN(x))   (Linear d -> 4d, GELU, Linear 4d -> d)
    logits = LN(x) @ E^T                  (weight tying: the output matrix is the token embedding)

Pre-LayerNorm (GPT-2) keeps training stable without long warmup. Initialisation follows GPT-2:
N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers). The model has no recurrent state:
each bptt window (at most `max_len` tokens) is attended to on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from lexiflow.models.attention import MultiHeadAttention
from lexiflow.models.dropout import Dropout
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.lm import train as training
from lexiflow.models.lm.config import TransformerConfig
from lexiflow.models.lm.module import LMModule, State
from lexiflow.models.lm.neural import NeuralLM
from lexiflow.models.lm.stream import pad_sequences
from lexiflow.models.transformer_blocks import sinusoidal_positions
from torch import nn


def count_parameters(c: TransformerConfig) -> int:
    """Closed form: V d (+ V d untied head) (+ max_len d learned positions) + L (12 d^2 + 13 d) + 2 d (final
    LayerNorm, pre-LN only)."""
    d = c.d_model
    n = c.vocab_size * d * (1 if c.tie_weights else 2) + c.n_layers * (12 * d * d + 13 * d) + 2 * d * (c.norm == "pre")
    return n + (c.max_len * d if c.positional == "learned" else 0)


class CausalSelfAttention(MultiHeadAttention):
    """The decoder's masked self-attention: models/attention.py's one attention (F.scaled_dot_product_attention,
    is_causal: the flash kernel on CUDA), then the residual dropout."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__(c.d_model, c.n_heads, c.dropout)
        self.resid_drop = Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resid_drop(super().forward(x, causal=True)[0])


def _split_fused_qkv(state_dict: dict, prefix: str, *args) -> None:
    """Weights saved before the LM used the shared attention (one `qkv` projection, `proj`) load as
    q_proj/k_proj/v_proj and out_proj: the same function, so the same model."""
    for key in [k for k in state_dict if k.startswith(prefix) and ".attn.qkv." in k]:
        for name, part in zip(("q_proj", "k_proj", "v_proj"), state_dict.pop(key).chunk(3), strict=True):
            state_dict[key.replace(".qkv.", f".{name}.")] = part
    for key in [k for k in state_dict if k.startswith(prefix) and ".attn.proj." in k]:
        state_dict[key.replace(".attn.proj.", ".attn.out_proj.")] = state_dict.pop(key)


class Block(nn.Module):
    """Pre-LN x + f(LN(x)) (default) or the notes' post-LN LayerNorm(x + f(x)), f = attention then the FFN."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.pre = c.norm == "pre"
        self.ln1 = nn.LayerNorm(c.d_model)
        self.attn = CausalSelfAttention(c)
        self.ln2 = nn.LayerNorm(c.d_model)
        act = nn.GELU() if c.ffn_activation == "gelu" else nn.ReLU()
        self.ffn = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), act, nn.Linear(4 * c.d_model, c.d_model),
                                 Dropout(c.dropout))  # d_ff = 4d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre:
            x = x + self.attn(self.ln1(x))
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ffn(x))


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
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(D) if config.norm == "pre" else nn.Identity()  # post-LN blocks end normalised
        self.lm_head = nn.Linear(D, V, bias=False)
        self.apply(self._init)
        # Vaswani §3.4: with fixed sinusoids (unit scale) the token embeddings are scaled by sqrt(d); init them
        # N(0, 1/d) so both terms start at unit scale (else the positions drown the tokens).
        self.emb_scale = math.sqrt(D) if config.positional == "sinusoidal" else 1.0
        if config.positional == "sinusoidal":
            nn.init.normal_(self.embedding.weight, std=D**-0.5)
        for name, p in self.named_parameters():
            if name.endswith("out_proj.weight") or name.endswith("ffn.2.weight"):  # residual outputs (GPT-2 scaling)
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layers))
        if config.tie_weights:
            self.lm_head.weight = self.embedding.weight  # E = V^T
        self._register_load_state_dict_pre_hook(_split_fused_qkv)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        h = self._embed(x)
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h)), None  # (B, T, V)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        if T > self.config.max_len:
            raise ParameterError(f"window of {T} tokens exceeds max_len={self.config.max_len}")
        pos = self.pos.weight[:T] if self.config.positional == "learned" else self.pe[:T]  # (T, D)
        return self.drop(self.embedding(x) * self.emb_scale + pos)  # (B, T, D)

    @torch.no_grad()
    def logit_lens(self, x: torch.Tensor) -> torch.Tensor:
        """(n_layers + 1, B, T, V) next-token logits read out of the residual stream after the embedding
        and after each block, through the final norm and the unembedding (notes 002, "Transformers as
        Updated Residual Streams": early decoding / logit lens); the last one is `forward`'s."""
        h = self._embed(x)
        out = [self.lm_head(self.ln_f(h))]
        for block in self.blocks:
            h = block(h)
            out.append(self.lm_head(self.ln_f(h)))
        return torch.stack(out)


class TransformerLM(NeuralLM):
    """GPT-style decoder LM estimator: `TransformerLM(TransformerConfig(V), TrainConfig(...)).fit(sentences)`."""

    kind = "transformer"
    config_class = TransformerConfig

    def _build(self) -> Transformer:
        return Transformer(self.config)

    def logit_lens_table(self, sentences: Sequence[np.ndarray], max_sentences: int = 1000) -> list[dict]:
        """Per layer (0 = the embedding), the perplexity and top-1 accuracy of the next-token predictions
        read out there (`Transformer.logit_lens`), over every word and </s> of the first `max_sentences`
        sentences, each scored from <s> within its first window."""
        self._check_fitted()
        c, module = self.config, self.module_
        module.eval()
        seqs = [np.concatenate(([c.bos_id], np.asarray(s, dtype=np.int64).ravel(), [c.eos_id]))[: self._window + 1]
                for s in list(sentences)[:max_sentences]]
        if not seqs:
            raise InputError("logit_lens_table: no sentences to score")
        nll = torch.zeros(c.n_layers + 1, dtype=torch.float64)
        correct = torch.zeros(c.n_layers + 1, dtype=torch.float64)
        count = 0
        for start in range(0, len(seqs), 64):
            data = pad_sequences(seqs[start : start + 64], c.pad_id).to(self.device_)
            x, y = data[:, :-1], data[:, 1:]
            keep = y != c.pad_id
            lens = module.logit_lens(x).float()  # (L+1, B, T, V)
            logp = F.log_softmax(lens, dim=-1)
            target = logp.gather(-1, y.expand(len(lens), -1, -1).unsqueeze(-1)).squeeze(-1)  # (L+1, B, T)
            nll += -(target * keep).sum(dim=(1, 2)).double().cpu()
            correct += ((lens.argmax(-1) == y) & keep).sum(dim=(1, 2)).double().cpu()
            count += int(keep.sum())
        return [{"layer": layer, "perplexity": training.perplexity(float(nll[layer]) / count),
                 "accuracy": float(correct[layer]) / count} for layer in range(c.n_layers + 1)]
