"""The calibration values: how the HMM weighs its known-word, unknown-word and transition scores.
Each is either fixed by the caller or tuned on dev accuracy (`HMMTagger.fit(..., dev=...)`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from lexiflow.models.errors import ParameterError


@dataclass(frozen=True)
class Calibration:
    """unknown_mix: weight of the logistic regression in the log-linear mix with the suffix model.
    emission_weight, unknown_weight: known and unknown emission scores relative to the transitions.
    rare_mix: weight of the unknown-word model in the emissions of rare known words.
    prior_weight: kappa in P(t | w) / P(t)^kappa (1 = Bayes' rule).
    case_mix: weight of the pooled emissions of an unknown word's known other casings (0 = off)."""

    unknown_mix: float = 0.5
    emission_weight: float = 1.0
    unknown_weight: float = 1.0
    rare_mix: float = 0.0
    prior_weight: float = 1.0
    case_mix: float = 0.0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


# Valid values of each; checked before fitting (NaN fails every check).
VALID = {
    "unknown_mix": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "emission_weight": (lambda v: v > 0, "> 0"),
    "unknown_weight": (lambda v: v > 0, "> 0"),
    "rare_mix": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "prior_weight": (lambda v: v >= 0, ">= 0 (1 = Bayes' rule)"),
    "case_mix": (lambda v: 0 <= v < 1, "in [0, 1)"),
}

# The values the coordinate search on dev tries, in this order.
GRIDS = {
    "unknown_mix": [0.0, 0.25, 0.5, 0.6, 0.75, 0.9, 1.0],
    "unknown_weight": [0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5],
    "emission_weight": [0.7, 0.8, 0.9, 1.0, 1.1, 1.2],
    "rare_mix": [0.0, 0.05, 0.1, 0.2, 0.3, 0.5],
    "prior_weight": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    "case_mix": [0.0, 0.01, 0.03, 0.1, 0.3, 0.5],
}


def check(fixed: dict[str, float | None]) -> None:
    """Fail on a fixed value outside its range (None = tune on dev)."""
    for name, value in fixed.items():
        valid, span = VALID[name]
        if value is not None and (not valid(value) or math.isnan(value)):
            raise ParameterError(f"{name}={value}: must be {span}, or None to tune it on dev")


def initial(unknown: str, fixed: dict[str, float | None]) -> Calibration:
    """The starting point: defaults (the unknown model's mix follows `unknown`), fixed values applied."""
    mix = {"suffix": 0.0, "logreg": 1.0}.get(unknown, 0.5)
    return Calibration(**{"unknown_mix": mix, **{k: float(v) for k, v in fixed.items() if v is not None}})
