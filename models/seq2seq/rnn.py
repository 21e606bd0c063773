"""RNN encoder–decoder (Cho et al. 2014; Sutskever et al. 2014), without or with attention (Luong et al. 2015).

    encoder:  h_1..h_S = (Bi)GRU/LSTM(E_src[x])                 stacked; padding packed away
    context:  c = the encoder's final state                      (the notes' baseline, 004)
    no attention:  s_t = RNN(s_{t-1}, [E_tgt[y_{t-1}]; c])       c fed at every step (Cho et al. 2014)
                   P(y_t | y_<t, x) = softmax(W_o s_t)
    attention:     s_t = RNN(s_{t-1}, E_tgt[y_{t-1}])
                   α_t = softmax_j score(s_t, h_j),  c_t = Σ_j α_tj h_j      (dot / general / additive)
                   h̃_t = tanh(W_c [c_t; s_t]),  P(y_t | y_<t, x) = softmax(W_o h̃_t)

The decoder starts from the encoder's final state (per layer; a bidirectional encoder's two directions
are joined by a linear "bridge" with tanh). Attention scores the *current* decoder state s_t (Luong's
global attention) rather than s_{t-1} with c_t fed back into the RNN (Bahdanau, the notes' formula): the
score functions are the same, and with teacher forcing the whole target side then runs as one RNN call
instead of a Python loop over steps (several times faster on CPU; benchmarks/seq2seq.py compares
against a Bahdanau-style reference). A bidirectional encoder's states (2H) are projected to H so that
`dot` can score them.

Decoding interface (models.seq2seq.decoding): `encode(src, src_mask) -> memory`, `start(memory) -> state`,
`step(memory, state, tokens) -> (log-probabilities, state, attention)`; every tensor batch-first, so a
beam reorders memory and state with one index_select on dim 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lexiflow.models.attention import make_score_attention
from lexiflow.models.seq2seq.config import RNNSeq2SeqConfig
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}
Memory = tuple[torch.Tensor, ...]
State = tuple[torch.Tensor, ...]




class RNNSeq2Seq(nn.Module):
    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        config.validate()
        self.config = c = config
        H, L, dirs = c.hidden_dim, c.num_layers, 2 if c.bidirectional else 1
        layer_drop = c.dropout if L > 1 else 0.0
        self.src_embedding = nn.Embedding(c.src_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        self.tgt_embedding = nn.Embedding(c.tgt_vocab_size, c.emb_dim, padding_idx=c.pad_id)
        self.encoder = CELLS[c.cell](c.emb_dim, H, L, batch_first=True, dropout=layer_drop,
                                     bidirectional=c.bidirectional)
        self.bridge = nn.Linear(dirs * H, H) if c.bidirectional else None  # final states of both directions -> s_0
        self.key_proj = nn.Linear(dirs * H, H) if c.bidirectional and c.attention != "none" else None
        self.attends = c.attention != "none"
        dec_in = c.emb_dim + (0 if self.attends else H)  # without attention, c is an input at every step
        self.decoder = CELLS[c.cell](dec_in, H, L, batch_first=True, dropout=layer_drop)
        if self.attends:
            self.attn = make_score_attention(c.attention, H, H)
            self.combine = nn.Linear(2 * H, H)  # h̃ = tanh(W_c [c_t; s_t])
        self.drop = nn.Dropout(c.dropout)
        self.out = nn.Linear(H, c.tgt_vocab_size)

    # -- encoder ------------------------------------------------------------------------------
    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> Memory:
        """(B, S) ids, (B, S) True = real token -> memory (keys (B, S, H), mask, s_0 per layer (B, L, H) [, c_0])."""
        c = self.config
        lengths = src_mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(self.drop(self.src_embedding(src)), lengths, batch_first=True,
                                      enforce_sorted=False)
        out, final = self.encoder(packed)
        keys, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])  # (B, S, dirs*H)
        finals = final if isinstance(final, tuple) else (final,)  # h_n [, c_n], each (L*dirs, B, H)
        starts = []
        for t in finals:
            if c.bidirectional:  # (L, 2, B, H) -> (L, B, 2H) -> bridge -> (L, B, H)
                t = torch.tanh(self.bridge(t.view(c.num_layers, 2, *t.shape[1:]).permute(0, 2, 1, 3).flatten(2)))
            starts.append(t.transpose(0, 1).contiguous())  # batch-first (B, L, H)
        if self.key_proj is not None:
            keys = self.key_proj(keys)
        return (keys, src_mask, *starts)

    def start(self, memory: Memory) -> State:
        return tuple(memory[2:])

    # -- decoder ------------------------------------------------------------------------------
    def _decode(self, memory: Memory, state: State, tokens: torch.Tensor,
                ) -> tuple[torch.Tensor, State, torch.Tensor | None]:
        """Teacher-forced or one-step decoder on tokens (B, T): (logits (B, T, V), state, attention (B, T, S))."""
        keys, mask = memory[0], memory[1]
        e = self.drop(self.tgt_embedding(tokens))
        if not self.attends:  # c = the top layer's final encoder state, at every step
            e = torch.cat([e, memory[2][:, -1:, :].expand(-1, tokens.shape[1], -1)], dim=-1)
        hx = tuple(s.transpose(0, 1).contiguous() for s in state)
        out, new = self.decoder(e, hx if self.config.cell == "lstm" else hx[0])  # (B, T, H)
        new = tuple(t.transpose(0, 1) for t in (new if isinstance(new, tuple) else (new,)))
        weights = None
        if self.attends:
            context, weights = self.attn(out, keys, mask)  # (B, T, H), (B, T, S)
            out = torch.tanh(self.combine(torch.cat([context, out], dim=-1)))
        return self.out(self.drop(out)), new, weights

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits (B, T, V) of the next target token at every position of tgt_in."""
        memory = self.encode(src, src_mask)
        logits, _, _ = self._decode(memory, self.start(memory), tgt_in)
        return logits

    def step(self, memory: Memory, state: State, tokens: torch.Tensor,
             ) -> tuple[torch.Tensor, State, torch.Tensor | None]:
        """One decoding step: tokens (B,) -> (log-probabilities (B, V), state, attention (B, S) or None)."""
        logits, state, weights = self._decode(memory, state, tokens[:, None])
        return F.log_softmax(logits[:, 0].float(), dim=-1), state, None if weights is None else weights[:, 0]
