"""Encoder–decoder Transformer (Vaswani et al. 2017; notes 000 and 002), from models.transformer_blocks.

    memory = Encoder(E_src[x] * sqrt(d) + PE)                 unmasked self-attention, padding keys masked
    h      = Decoder(E_tgt[y_<t] * sqrt(d) + PE, memory)      masked self-attention, cross-attention to memory
    P(y_t | y_<t, x) = softmax(h_t E_tgtᵀ)                    the target embedding is the output matrix (tied)

norm="post" is the paper's and the notes' LayerNorm(x + Sublayer(x)); "pre" trains without warmup. The
decoding interface matches models.seq2seq.rnn: the state is the target prefix (B, t), and each step reruns
the decoder over it (no key/value cache: sentences are short, and the code stays one readable path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lexiflow.models.seq2seq.config import TransformerSeq2SeqConfig
from lexiflow.models.transformer_blocks import Decoder, Embeddings, Encoder
from torch import nn

Memory = tuple[torch.Tensor, ...]
State = tuple[torch.Tensor, ...]




class TransformerSeq2Seq(nn.Module):
    def __init__(self, config: TransformerSeq2SeqConfig) -> None:
        super().__init__()
        config.validate()
        self.config = c = config
        self.src_embed = Embeddings(c.src_vocab_size, c.d_model, c.max_len, c.positional, c.dropout)
        self.tgt_embed = Embeddings(c.tgt_vocab_size, c.d_model, c.max_len, c.positional, c.dropout)
        self.encoder = Encoder(c.block(), c.encoder_layers)
        self.decoder = Decoder(c.block(), c.decoder_layers)
        self.out = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        for name, p in self.named_parameters():  # Xavier for the projections (the paper's reference code)
            if p.dim() == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        if c.tie_embeddings:
            self.out.weight = self.tgt_embed.token.weight

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> Memory:
        return self.encoder(self.src_embed(src), src_mask), src_mask

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        memory, mask = self.encode(src, src_mask)
        h, _ = self.decoder(self.tgt_embed(tgt_in), memory, mask, tgt_in != self.config.pad_id)
        return self.out(h)

    def start(self, memory: Memory) -> State:
        return (memory[0].new_zeros((memory[0].shape[0], 0), dtype=torch.long),)

    def step(self, memory: Memory, state: State, tokens: torch.Tensor,
             ) -> tuple[torch.Tensor, State, torch.Tensor]:
        """tokens (B,) appended to the prefix -> (log-probabilities (B, V), the new prefix, cross-attention (B, S)
        of the last layer, averaged over heads)."""
        prefix = torch.cat([state[0], tokens[:, None]], dim=1)
        h, weights = self.decoder(self.tgt_embed(prefix), memory[0], memory[1], need_weights=True)
        return F.log_softmax(self.out(h[:, -1]).float(), dim=-1), (prefix,), weights[:, -1]
