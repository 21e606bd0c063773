"""BERT's masked-LM corruption (Devlin et al. 2019; notes 000 "MLM - the 80-10-10 strategy", 004).

Each token that is not special is chosen with probability p (0.15); of the chosen ones 80 % become [MASK],
10 % a random token, 10 % stay as they are. The loss is computed on the chosen positions only: their
labels are the original ids, every other label is -100 (cross_entropy's ignore_index). The random
replacement is drawn uniformly from the non-special ids (a [PAD] or [CLS] in the middle of a sentence
would teach nothing). Called on every batch of every epoch with a fresh draw, it is RoBERTa's dynamic
masking (Liu et al. 2019): a sentence gets new masks each time it is seen.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from lexiflow.models.errors import ParameterError

IGNORE = -100
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the chosen tokens; the remaining 0.1 stay unchanged


def mask_tokens(ids: torch.Tensor, *, mask_id: int, vocab_size: int, special_ids: Iterable[int],
                probability: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) for masked-LM training from an int tensor of token ids (any shape, e.g. (B, T)).

    `special_ids` ([CLS], [SEP], [PAD], [MASK], ...) are never chosen. `generator` (on ids' device) makes
    the draw reproducible; the caller seeds it per batch and epoch for dynamic masking.
    """
    if not 0.0 < probability < 1.0:
        raise ParameterError(f"mask probability={probability}: use a value in (0, 1), BERT's is 0.15")
    specials = torch.tensor(sorted(set(special_ids)), dtype=ids.dtype, device=ids.device)
    if not 0 <= mask_id < vocab_size or len(specials) >= vocab_size:
        raise ParameterError(f"mask_id={mask_id} with vocab_size={vocab_size} and {len(specials)} special ids: "
                             "the [MASK] id must be in the vocabulary and some ids must be ordinary tokens")
    draw = torch.rand(ids.shape, generator=generator, device=ids.device)
    chosen = (draw < probability) & ~torch.isin(ids, specials)
    # One more uniform per token splits the chosen ones 80 / 10 / 10.
    action = torch.rand(ids.shape, generator=generator, device=ids.device)
    to_mask = chosen & (action < MASK_SHARE)
    to_random = chosen & (action >= MASK_SHARE) & (action < MASK_SHARE + RANDOM_SHARE)
    ordinary = torch.ones(vocab_size, dtype=torch.bool, device=ids.device)
    ordinary[specials[(specials >= 0) & (specials < vocab_size)]] = False
    pool = ordinary.nonzero().squeeze(1).to(ids.dtype)
    random_ids = pool[torch.randint(len(pool), ids.shape, generator=generator, device=ids.device)]
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), torch.where(to_random, random_ids, ids))
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    return inputs, labels
