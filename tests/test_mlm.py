"""The masked-LM recipe (models/mlm.py): 15 % chosen, 80/10/10, specials never chosen, labels -100 elsewhere."""

import pytest
import torch
from lexiflow.models.errors import ParameterError
from lexiflow.models.mlm import IGNORE, mask_tokens

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "man", "went", "to", "store", "running", "he", "bought"]
T2I = {w: i for i, w in enumerate(VOCAB)}
SPECIALS = [0, 1, 2, 3, 4]


def encode(text):
    return torch.tensor([[T2I[w] for w in text.split()]])


def test_notes_worked_example():
    """000 "MLM - the 80-10-10 strategy": [CLS] the man went to the store [SEP] -> [CLS] the man [MASK] to the
    running [SEP], loss on "went" and "store" only. Seed 205 of torch's CPU generator draws exactly that
    (went -> [MASK], store -> a random word that happens to be "running")."""
    ids = encode("[CLS] the man went to the store [SEP]")
    inputs, labels = mask_tokens(ids, mask_id=4, vocab_size=len(VOCAB), special_ids=SPECIALS,
                                 generator=torch.Generator().manual_seed(205))
    assert " ".join(VOCAB[i] for i in inputs[0]) == "[CLS] the man [MASK] to the running [SEP]"
    assert labels[0].tolist() == [IGNORE, IGNORE, IGNORE, T2I["went"], IGNORE, IGNORE, T2I["store"], IGNORE]


def test_statistics_over_many_draws():
    g = torch.Generator().manual_seed(0)
    V = 1000
    ids = torch.randint(5, V, (400, 250), generator=g)
    ids[:, 0], ids[:, -1], ids[:, -40:-1] = 2, 3, 0  # [CLS] ... [SEP] and padding
    inputs, labels = mask_tokens(ids, mask_id=4, vocab_size=V, special_ids=SPECIALS, generator=g)
    ordinary = ~torch.isin(ids, torch.tensor(SPECIALS))
    chosen = labels != IGNORE
    n_ordinary, n_chosen = int(ordinary.sum()), int(chosen.sum())  # 84,400 ordinary tokens
    # binomial sd of the share is sqrt(.15 * .85 / 84400) = 0.0012: 4 sd
    assert abs(n_chosen / n_ordinary - 0.15) < 0.005
    assert not (chosen & ~ordinary).any()  # specials never chosen
    assert torch.equal(inputs[~chosen], ids[~chosen])  # nothing else touched
    assert torch.equal(labels[chosen], ids[chosen])  # labels are the original tokens
    masked = (inputs == 4) & chosen
    changed = chosen & (inputs != ids) & (inputs != 4)  # random replacements that differ from the token
    # of ~12,660 chosen: sd of an 80 % share 0.0036, of a 10 % share 0.0027
    assert abs(int(masked.sum()) / n_chosen - 0.8) < 0.015
    # a random draw equals the original with probability 1/995; the rest stayed unchanged
    random_share = int(changed.sum()) / n_chosen / (1 - 1 / (V - 5))
    assert abs(random_share - 0.1) < 0.012
    unchanged = chosen & (inputs == ids)
    assert abs(int(unchanged.sum()) / n_chosen - 0.1) < 0.012
    assert not torch.isin(inputs[changed], torch.tensor(SPECIALS)).any()  # random ids are ordinary tokens


def test_dynamic_masking_draws_new_masks():
    ids = torch.randint(5, 100, (8, 64), generator=torch.Generator().manual_seed(1))
    a = mask_tokens(ids, mask_id=4, vocab_size=100, special_ids=SPECIALS, generator=torch.Generator().manual_seed(1))
    b = mask_tokens(ids, mask_id=4, vocab_size=100, special_ids=SPECIALS, generator=torch.Generator().manual_seed(2))
    again = mask_tokens(ids, mask_id=4, vocab_size=100, special_ids=SPECIALS,
                        generator=torch.Generator().manual_seed(1))
    assert not torch.equal(a[1], b[1])
    assert torch.equal(a[0], again[0]) and torch.equal(a[1], again[1])


def test_bad_probability_is_a_parameter_error():
    with pytest.raises(ParameterError, match="mask probability"):
        mask_tokens(encode("the man"), mask_id=4, vocab_size=len(VOCAB), special_ids=SPECIALS, probability=1.5)
