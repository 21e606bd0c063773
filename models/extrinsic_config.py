"""The extrinsic genre classifier's configuration, apart from its torch model (models/extrinsic.py): the
pipeline derives its parameters without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from lexiflow.models.config import check
from pydantic import Field


@dataclass(frozen=True)
class ClassifierConfig:
    """The extrinsic classifier's settings (pipeline parameters of the evaluation section)."""

    classifier_hidden1: Annotated[int, Field(ge=1, le=4096, description="Extrinsic classifier: first hidden layer "
                                                                        "size d1.")] = 128
    classifier_hidden2: Annotated[int, Field(ge=1, le=4096, description="Extrinsic classifier: second hidden layer "
                                                                        "size d2.")] = 64
    classifier_activation: Annotated[Literal["relu", "tanh", "sigmoid"], Field(
        description="Extrinsic classifier: activation f of the hidden layers.")] = "relu"
    classifier_epochs: Annotated[int, Field(ge=1, le=500, description="Extrinsic classifier: passes over train (the "
                                                                      "best epoch on dev is kept).")] = 30
    classifier_lr: Annotated[float, Field(gt=0, le=1, description="Extrinsic classifier: Adam step size.")] = 1e-3
    classifier_seed: Annotated[int, Field(ge=0, description="Extrinsic classifier: random seed.")] = 0

    def validate(self) -> None:
        check(self)
