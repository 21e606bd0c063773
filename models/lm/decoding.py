"""Decoding for any language model exposed as its batched scorer, `log_probs_batch(contexts) -> (B, V)`
(`NgramLM.log_probs_batch`, `NeuralLM.log_probs_batch`): greedy and sampling score one context a
step, beam search all its live hypotheses in one call a step.

Strategies:
- greedy: the argmax token at each step (lowest id on ties).
- beam: beam search of width k (Graves 2012; Sutskever et al. 2014) with length normalisation:
  a hypothesis of |Y| generated tokens (its `</s>` included) and total log-probability
  log P(Y) scores ``log P(Y) / |Y| ** alpha`` (alpha = 0: raw sum, favours short outputs; alpha = 1:
  mean log-probability). Default alpha = 0.6 (the value Wu et al. 2016 found best, used here with the
  plain |Y| ** alpha penalty rather than GNMT's ((5 + |Y|) / 6) ** alpha).
- sample: ancestral sampling with, in this order, temperature (logits / T; T = 0 is greedy),
  top-k (the k most probable tokens, Fan et al. 2018) and top-p / nucleus (the smallest set of most
  probable tokens whose mass is >= p, Holtzman et al. 2020); the kept mass is renormalised.

Before every choice (all three strategies), the scorer's log-probabilities are adjusted by `adjust`:
- `banned` tokens get probability 0: by default the special tokens other than `</s>` (`<unk> <s> <pad>`,
  ids 0, 1, 3 in every lexiflow vocabulary), so a model that learned `<unk>` as a likely word never
  writes it; pass the tokenizer's (`never_generated(tokenizer)`), or `banned=()` to allow everything.
- `repetition_penalty` (Keskar et al. 2019, HF's `repetition_penalty`): a token already in the context
  (prompt included) has its score multiplied by the penalty when negative, divided when positive; the
  scores here are log-probabilities (<= 0), so a penalty > 1 makes a seen token less likely. 1 is off.
- `no_repeat_ngram` = n (HF's `no_repeat_ngram_size`): a token that would complete an n-gram already in
  the context (prompt included) gets probability 0. 0 is off.
Beam search adds the adjusted scores to its hypotheses' totals (as HF's beam search does); sampling
applies temperature, top-k and top-p after the adjustment. A step where no token is left allowed ends
the generation.

A context passed to the scorer is ``prompt_ids + generated`` (start the prompt with `<s>`).
Every function returns the generated ids only (not the prompt), ending with `eos_id` when the model
produced it; generation stops there or after `max_new_tokens`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence

import numpy as np
from lexiflow.models.errors import ParameterError
from lexiflow.models.vocab import BOS_ID, PAD_ID, UNK_ID

LogProbsBatch = Callable[[Sequence[Sequence[int]]], np.ndarray]  # B contexts -> (B, V) natural-log probabilities
STRATEGIES = ("greedy", "beam", "sample")

NEVER_GENERATED = (UNK_ID, BOS_ID, PAD_ID)  # the default `banned`: every special token but </s>

_TIE = 1e-12  # relative slack when comparing a cumulative mass with p (probabilities come from exp(log p))


def never_generated(tokenizer, allow_unk: bool = False) -> tuple[int, ...]:
    """A tokenizer's special tokens but `</s>` (and `<unk>` with `allow_unk`): `banned` for its LM."""
    allowed = {tokenizer.eos_id, *([tokenizer.unk_id] if allow_unk else [])}
    return tuple(i for i in tokenizer.special_ids if i not in allowed)


def _check_common(max_new_tokens: int, repetition_penalty: float, no_repeat_ngram: int) -> None:
    if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
        raise ParameterError(f"max_new_tokens={max_new_tokens!r}: must be an integer >= 0")
    if not 0 < repetition_penalty < np.inf:  # NaN fails too
        raise ParameterError(f"repetition_penalty={repetition_penalty!r}: must be a finite number > 0 (1 is off)")
    if not isinstance(no_repeat_ngram, int | np.integer) or no_repeat_ngram < 0:
        raise ParameterError(f"no_repeat_ngram={no_repeat_ngram!r}: must be an integer >= 0 (0 is off)")


def repeated_ngram_ends(context: Sequence[int], n: int) -> list[int]:
    """The tokens that would complete an n-gram already in `context` (HF's `no_repeat_ngram_size`)."""
    if n < 1 or len(context) + 1 < n:
        return []
    prefix = list(context[len(context) - n + 1:])  # the last n - 1 tokens ([] for n = 1)
    return [context[i + n - 1] for i in range(len(context) - n + 1) if list(context[i:i + n - 1]) == prefix]


def adjust(log_probs: np.ndarray, contexts: Sequence[Sequence[int]], banned: Collection[int] = NEVER_GENERATED,
           repetition_penalty: float = 1.0, no_repeat_ngram: int = 0) -> np.ndarray:
    """(B, V) the scores a choice is made from, one row per context (see the module docstring)."""
    scores = np.array(log_probs, dtype=np.float64).reshape(len(contexts), -1)  # a copy: the scorer's stays intact
    scores[:, list(banned)] = -np.inf
    for row, context in zip(scores, contexts, strict=True):
        if repetition_penalty != 1.0 and len(context):
            seen = np.unique(np.asarray(context, dtype=np.int64))
            row[seen] = np.where(row[seen] < 0, row[seen] * repetition_penalty, row[seen] / repetition_penalty)
        row[repeated_ngram_ends(context, no_repeat_ngram)] = -np.inf
    return scores


def next_scores(log_probs_batch: LogProbsBatch, context: Sequence[int], **adjustments) -> np.ndarray:
    """(V,) the adjusted scores after one context."""
    return adjust(log_probs_batch([context]), [context], **adjustments)[0]


def greedy(log_probs_batch: LogProbsBatch, prompt_ids: Sequence[int], max_new_tokens: int = 50,
           eos_id: int = 2, banned: Collection[int] = NEVER_GENERATED, repetition_penalty: float = 1.0,
           no_repeat_ngram: int = 0) -> list[int]:
    """Pick the most probable allowed next token until `eos_id` or `max_new_tokens` (ties: lowest id)."""
    _check_common(max_new_tokens, repetition_penalty, no_repeat_ngram)
    context, out = [int(t) for t in prompt_ids], []
    for _ in range(max_new_tokens):
        scores = next_scores(log_probs_batch, context, banned=banned, repetition_penalty=repetition_penalty,
                             no_repeat_ngram=no_repeat_ngram)
        token = int(np.argmax(scores))
        if scores[token] == -np.inf:
            break  # no token allowed
        out.append(token)
        context.append(token)
        if token == eos_id:
            break
    return out


def filter_probs(
    log_probs: np.ndarray, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """The sampling distribution (V,) after temperature, top-k and top-p; sums to 1.

    temperature = 0 puts all mass on the argmax (lowest id on ties). top-k keeps the k most probable
    tokens (ties broken towards lower ids); top-p then keeps the smallest prefix of the tokens sorted by
    probability whose mass reaches p (within a relative 1e-12, as the probabilities come from logs).
    """
    lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    if not 0 <= temperature < np.inf:  # NaN fails too
        raise ParameterError(f"temperature={temperature!r}: must be a finite number >= 0 (0 is greedy)")
    if top_k is not None and (not isinstance(top_k, int | np.integer) or top_k < 1):
        raise ParameterError(f"top_k={top_k!r}: must be an integer >= 1, or None to keep every token")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ParameterError(f"top_p={top_p!r}: must be in (0, 1], or None to keep every token")
    if not np.isfinite(lp.max(initial=-np.inf)):
        raise ParameterError("log_probs: every token has probability 0 (or NaN); the model gives no distribution")
    if temperature == 0:
        probs = np.zeros_like(lp)
        probs[int(np.argmax(lp))] = 1.0
        return probs
    with np.errstate(over="ignore"):  # a tiny temperature sends every non-maximal logit to -inf
        logits = (lp - lp.max()) / temperature
    probs = np.exp(logits)  # (V,), unnormalised, max entry is 1
    order = np.argsort(-probs, kind="stable")  # most probable first, lower id first on ties
    keep = np.zeros(lp.size, dtype=bool)
    n_keep = lp.size if top_k is None else min(top_k, lp.size)
    if top_p is not None and top_p < 1.0:
        sorted_p = probs[order[:n_keep]]
        mass = np.cumsum(sorted_p) / sorted_p.sum()
        n_keep = min(n_keep, int(np.searchsorted(mass, top_p * (1 - _TIE))) + 1)  # first index with mass >= p
    keep[order[:n_keep]] = True
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()


def sample(
    log_probs_batch: LogProbsBatch,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 50,
    eos_id: int = 2,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | np.random.Generator = 0,
    banned: Collection[int] = NEVER_GENERATED,
    repetition_penalty: float = 1.0,
    no_repeat_ngram: int = 0,
) -> list[int]:
    """Ancestral sampling from `filter_probs(<the adjusted scores>, temperature, top_k, top_p)`."""
    _check_common(max_new_tokens, repetition_penalty, no_repeat_ngram)
    if not isinstance(seed, np.random.Generator) and (not isinstance(seed, int | np.integer) or seed < 0):
        raise ParameterError(f"seed={seed!r}: must be an integer >= 0 or a numpy.random.Generator")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    context, out = [int(t) for t in prompt_ids], []
    for _ in range(max_new_tokens):
        scores = next_scores(log_probs_batch, context, banned=banned, repetition_penalty=repetition_penalty,
                             no_repeat_ngram=no_repeat_ngram)
        if scores.max() == -np.inf:
            break  # no token allowed
        probs = filter_probs(scores, temperature, top_k, top_p)
        # inverse CDF: one uniform draw per step, so a seed gives the same tokens on every platform
        token = int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right"))
        token = min(token, probs.size - 1)
        while probs[token] == 0:  # rounding can land on a zero-mass slot at the end: step back
            token -= 1
        out.append(token)
        context.append(token)
        if token == eos_id:
            break
    return out


def beam(
    log_probs_batch: LogProbsBatch,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 50,
    eos_id: int = 2,
    width: int = 4,
    alpha: float = 0.6,
    banned: Collection[int] = NEVER_GENERATED,
    repetition_penalty: float = 1.0,
    no_repeat_ngram: int = 0,
) -> list[int]:
    """Beam search: keep the `width` best partial hypotheses by total log-probability; a candidate
    ending in `eos_id` that ranks within the best `width` candidates of its step is finished. At the end
    (no live hypothesis, or `max_new_tokens` reached) the best of the finished and still-live
    hypotheses by ``log P(Y) / |Y| ** alpha`` wins. The live hypotheses of a step are scored in one
    call of `log_probs_batch`; each hypothesis's scores are adjusted for its own context."""
    _check_common(max_new_tokens, repetition_penalty, no_repeat_ngram)
    if not isinstance(width, int | np.integer) or width < 1:
        raise ParameterError(f"width={width!r}: the beam width must be an integer >= 1")
    if alpha < 0:
        raise ParameterError(f"alpha={alpha!r}: the length-normalisation exponent must be >= 0")
    prompt = [int(t) for t in prompt_ids]
    live: list[tuple[list[int], float]] = [([], 0.0)]  # (generated ids, total log-probability)
    finished: list[tuple[list[int], float]] = []
    for _ in range(max_new_tokens):
        if not live:
            break
        contexts = [prompt + toks for toks, _ in live]
        scores = adjust(log_probs_batch(contexts), contexts, banned, repetition_penalty, no_repeat_ngram)  # (B, V)
        # a hypothesis with no token allowed ends as it is
        finished += [h for h, row in zip(live, scores, strict=True) if h[0] and row.max() == -np.inf]
        totals = scores + np.array([s for _, s in live])[:, None]  # (B, V)
        V = totals.shape[1]
        n_cand = min(2 * width, totals.size)  # width live + up to width finished per step
        flat = totals.reshape(-1)
        best = np.argsort(-flat, kind="stable")[:n_cand]
        new_live = []
        for rank, f in enumerate(best):
            total = float(flat[f])
            if total == -np.inf:
                break
            b, token = divmod(int(f), V)
            hyp = (live[b][0] + [token], total)
            if token == eos_id:
                if rank < width:
                    finished.append(hyp)
            elif len(new_live) < width:
                new_live.append(hyp)
        live = new_live
    candidates = finished + [h for h in live if h[0]]
    if not candidates:
        return []
    scores = [total / len(toks) ** alpha for toks, total in candidates]
    return candidates[int(np.argmax(scores))][0]


def generate(log_probs_batch: LogProbsBatch, prompt_ids: Sequence[int], strategy: str = "greedy",
             **options) -> list[int]:
    """One entry point: `strategy` in greedy / beam / sample, `options` those of the function
    (all: max_new_tokens, eos_id, banned, repetition_penalty, no_repeat_ngram; beam: width, alpha;
    sample: temperature, top_k, top_p, seed)."""
    functions = {"greedy": greedy, "beam": beam, "sample": sample}
    if strategy not in functions:
        raise ParameterError(f"strategy={strategy!r}: choose one of {', '.join(STRATEGIES)}")
    fn = functions[strategy]
    allowed = set(inspect.signature(fn).parameters) - {"log_probs_batch", "prompt_ids"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ParameterError(f"generate(strategy={strategy!r}): unknown option(s) {', '.join(unknown)}; "
                             f"{strategy} takes {', '.join(sorted(allowed))}")
    return fn(log_probs_batch, prompt_ids, **options)
