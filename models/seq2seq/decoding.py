"""Greedy and beam search for encoder–decoder models, batched (notes 004 "Beam Search").

A model offers `encode(src, src_mask) -> memory`, `start(memory) -> state` and
`step(memory, state, tokens) -> (log-probabilities (B, V), state, attention (B, S) or None)`, every tensor
batch-first. A hypothesis is y_1..y_n with y_n = </s> and n <= max_len, where a sentence's max_len is
`max_len_a * source length + max_len_b` (relative to the source; at the last step only </s> is allowed);
<s> and <pad> are never generated.

Beam search keeps, per sentence, the `beam_width` best prefixes by log P(y_1..y_t | x) = Σ log P(y_i | y_<i, x).
A candidate ending in </s> among the best `beam_width` of a step is finished; the sentence stops when it
has `beam_width` finished hypotheses (or at max_len). Finished hypotheses rank by the length-normalised
score log P(y | x) / n^α: α = 0 is the raw log-probability (favours short outputs), α = 1 the notes'
average (1/T') Σ log P. With a width covering every prefix it is exhaustive search (tests/test_seq2seq.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lexiflow.models.errors import ParameterError


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, ending with </s>
    log_prob: float  # Σ log P(y_t | y_<t, x)
    score: float  # log_prob / len(tokens)^alpha
    attention: torch.Tensor | None = None  # (len(tokens), S) cross-attention rows, when asked


def _restrict(logp: torch.Tensor, last: torch.Tensor, bos_id: int, eos_id: int, pad_id: int | None) -> None:
    """In place: <s> and <pad> are never generated; rows at their last allowed step may only end (</s>)."""
    logp[:, [i for i in (bos_id, pad_id) if i is not None and i != eos_id]] = -torch.inf
    logp[last, :eos_id] = -torch.inf
    logp[last, eos_id + 1:] = -torch.inf


def _max_lens(src_mask: torch.Tensor, a: float, b: int, cap: int | None) -> torch.Tensor:
    lens = (src_mask.sum(1).float() * a + b).long().clamp(min=1)
    return lens.clamp(max=cap) if cap is not None else lens


def _check(beam_width: int, alpha: float, n_best: int) -> None:
    if beam_width < 1:
        raise ParameterError(f"beam_width={beam_width}: use 1 or more (1 is greedy)")
    if not 1 <= n_best <= beam_width:
        raise ParameterError(f"n_best={n_best}: use 1 to beam_width={beam_width}")
    if alpha < 0:
        raise ParameterError(f"length_penalty alpha={alpha}: use 0 (none) or more (1 = average log-probability)")


def _select(tensors: tuple[torch.Tensor, ...], index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.index_select(0, index) for t in tensors)


@torch.no_grad()
def greedy(model, src: torch.Tensor, src_mask: torch.Tensor, bos_id: int, eos_id: int, *, pad_id: int | None = None,
           max_len_a: float = 1.5,
           max_len_b: int = 5, max_len_cap: int | None = None, alpha: float = 0.0,
           return_attention: bool = False) -> list[Hypothesis]:
    """The most probable token at every step, for the whole batch at once."""
    B = src.shape[0]
    max_lens = _max_lens(src_mask, max_len_a, max_len_b, max_len_cap)
    memory = model.encode(src, src_mask)
    state = model.start(memory)
    tokens = torch.full((B,), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out, log_probs, attn = [], torch.zeros(B, device=src.device), []
    for t in range(int(max_lens.max())):
        logp, state, weights = model.step(memory, state, tokens)
        _restrict(logp, t >= max_lens - 1, bos_id, eos_id, pad_id)
        tokens = logp.argmax(-1)
        log_probs += torch.where(done, 0.0, logp.gather(1, tokens[:, None])[:, 0])
        tokens = torch.where(done, eos_id, tokens)
        out.append(tokens)
        if return_attention and weights is not None:
            attn.append(weights.float().cpu())
        done |= tokens == eos_id
        if bool(done.all()):
            break
    ids = torch.stack(out, 1).tolist()
    hyps = []
    for b in range(B):
        n = ids[b].index(eos_id) + 1
        lp = float(log_probs[b])
        a = torch.stack([w[b] for w in attn[:n]]) if attn else None
        hyps.append(Hypothesis(ids[b][:n], lp, lp / n**alpha, a))
    return hyps


@torch.no_grad()
def beam_search(model, src: torch.Tensor, src_mask: torch.Tensor, bos_id: int, eos_id: int, *,
                pad_id: int | None = None, beam_width: int = 5, alpha: float = 1.0, n_best: int = 1,
                max_len_a: float = 1.5, max_len_b: int = 5,
                max_len_cap: int | None = None, return_attention: bool = False) -> list[list[Hypothesis]]:
    """The `n_best` best hypotheses per sentence (best first) by log P / n^alpha."""
    _check(beam_width, alpha, n_best)
    B, K, dev = src.shape[0], beam_width, src.device
    max_lens = _max_lens(src_mask, max_len_a, max_len_b, max_len_cap).tolist()
    rows = torch.arange(B, device=dev).repeat_interleave(K)  # beam row -> sentence
    memory = _select(model.encode(src, src_mask), rows)
    state = model.start(memory)
    tokens = torch.full((B * K,), bos_id, dtype=torch.long, device=dev)
    scores = torch.full((B, K), -torch.inf, device=dev)
    scores[:, 0] = 0.0  # one live prefix per sentence at the start
    finished: list[list[tuple[float, float, int, int]]] = [[] for _ in range(B)]  # (score, log P, step, beam)
    done = [False] * B
    history: list[tuple[list[list[int]], list[list[int]], torch.Tensor | None]] = []  # (tokens, parents, attn)
    for t in range(max(max_lens)):
        logp, state, weights = model.step(memory, state, tokens)
        V = logp.shape[-1]
        last = torch.tensor([t >= m - 1 for m in max_lens], device=dev).repeat_interleave(K)
        _restrict(logp, last, bos_id, eos_id, pad_id)
        cand = (scores[:, :, None] + logp.view(B, K, V)).view(B, K * V)
        top_scores, top_idx = cand.topk(min(2 * K, K * V), dim=1)  # 2K: K may end here and K still go on
        top_scores, top_idx = top_scores.tolist(), top_idx.tolist()
        new_scores = torch.full((B, K), -torch.inf, device=dev)
        new_tokens = [[eos_id] * K for _ in range(B)]
        parents = [[0] * K for _ in range(B)]
        for b in range(B):
            if done[b]:
                continue
            alive = 0
            for rank, (s, idx) in enumerate(zip(top_scores[b], top_idx[b], strict=True)):
                if s == -torch.inf or alive == K:
                    break
                parent, tok = divmod(idx, V)
                if tok == eos_id:
                    if rank < K:  # only a top-K candidate may finish (as a beam of width K would hold it)
                        finished[b].append((s / (t + 1) ** alpha, s, t, b * K + parent))
                    continue
                new_scores[b, alive] = s
                new_tokens[b][alive], parents[b][alive] = tok, parent
                alive += 1
            if len(finished[b]) >= K or alive == 0:
                done[b] = True
                new_scores[b] = -torch.inf
        history.append((new_tokens, parents, weights.float().cpu() if return_attention and weights is not None
                        else None))
        if all(done):
            break
        scores = new_scores
        order = torch.tensor([b * K + p for b in range(B) for p in parents[b]], device=dev)
        memory, state = _select(memory, order), _select(state, order)
        tokens = torch.tensor([tok for b in range(B) for tok in new_tokens[b]], device=dev)
    return [[_backtrack(history, f, K, eos_id, alpha) for f in sorted(finished[b], key=lambda f: -f[0])[:n_best]]
            for b in range(B)]


def _backtrack(history, f: tuple[float, float, int, int], K: int, eos_id: int, alpha: float) -> Hypothesis:
    """The tokens (and attention rows) of a hypothesis that ended with </s> at step t from beam row `row`."""
    score, log_prob, t, row = f
    tokens, attn = [eos_id], []
    if history[t][2] is not None:
        attn.append(history[t][2][row])
    b, k = divmod(row, K)
    for s in range(t - 1, -1, -1):
        step_tokens, parents, weights = history[s]
        tokens.append(step_tokens[b][k])
        if weights is not None:
            attn.append(weights[b * K + parents[b][k]])
        k = parents[b][k]
    tokens.reverse()
    attn.reverse()
    return Hypothesis(tokens, log_prob, score, torch.stack(attn) if attn else None)
