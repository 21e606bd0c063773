"""GloVe's configuration, apart from its torch trainer (models/glove.py): the pipeline derives its parameters
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from lexiflow.models.config import check
from lexiflow.models.device import Device
from lexiflow.models.threads import DEFAULT_THREADS, Threads
from pydantic import Field

Optimizer = Literal["adagrad", "adam"]


@dataclass(frozen=True)
class GloVeConfig:
    """Hyperparameters (annotated: pipeline parameters, models/config.py). Defaults were tuned on dev
    word pairs for a ~1 M-token corpus, see docs/embeddings.md."""

    dim: Annotated[int, Field(ge=2, le=2000, description="Embedding dimension.")] = 100
    # f(x) saturates at 1 from x_max on (harmonic-weighted counts); paper: 100
    x_max: Annotated[float, Field(gt=0, description="f(x) = min(1, (x/x_max)^alpha); tuned for ~1M-token "
                                                    "corpora.")] = 0.5
    alpha: Annotated[float, Field(gt=0, le=2, description="Exponent of the weighting f.")] = 0.75
    # dev quality rises little after ~15 epochs (1 M tokens, these defaults)
    epochs: Annotated[int, Field(ge=1, le=1000, description="Passes over the nonzero cells.")] = 20
    # the paper's 0.05; 0.1 reaches the same dev scores in half the epochs
    lr: Annotated[float, Field(gt=0, le=10, description="AdaGrad (or Adam) step size.")] = 0.1
    batch_size: Annotated[int, Field(ge=1, description="Nonzero cells per step.")] = 65536
    optimizer: Annotated[Optimizer, Field(description="AdaGrad as in the original, or Adam.")] = "adagrad"
    adagrad_init: Annotated[float, Field(gt=0, description="AdaGrad's initial accumulator G0 (glove.c with learning "
                                                           "rate eta = lr 1, adagrad_init 1/eta^2).")] = 1.0
    negative: Annotated[int, Field(ge=0, le=100, description="Unobserved (zero) cells drawn per observed cell and "
                                                             "held below a fraction of the smallest count; 0 = the "
                                                             "paper's objective.")] = 5
    negative_weight: Annotated[float, Field(gt=0, description="Weight of an unobserved cell's one-sided squared "
                                                              "error.")] = 1.0
    negative_bound: Annotated[float, Field(gt=0, le=1, description="Unobserved cells are held below this fraction "
                                                                   "of the smallest count (0.5 tuned on dev "
                                                                   "pairs).")] = 0.5
    spectrum_power: Annotated[float, Field(gt=0, le=10, description="The vectors' singular values raised to this "
                                                                    "power (1 = as trained; > 1 favours similarity "
                                                                    "over relatedness).")] = 1.5
    device: Device = "auto"
    seed: Annotated[int, Field(ge=0, description="Random seed.")] = 0
    threads: Threads = DEFAULT_THREADS

    def validate(self) -> None:
        check(self)
