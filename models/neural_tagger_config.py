"""The BiLSTM tagger's configuration, apart from its torch model (models/neural_tagger.py): the pipeline
derives its parameters without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from lexiflow.models.config import check
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm.config import TrainConfig
from pydantic import Field


@dataclass
class TaggerConfig:
    """Everything that defines a BiLSTM tagger and its training (`train`: the project's TrainConfig)."""

    word_dim: int = 100  # with pretrained vectors: their width
    lowercase_words: bool = True
    freeze_embeddings: bool = False  # pretrained vectors only
    pretrained_max_words: int = 200_000  # pretrained words added to the vocabulary (most frequent first)
    word_dropout_alpha: Annotated[float, Field(ge=0, le=100, description="BiLSTM: a training word seen c times is "
                                               "read as <unk> with probability α / (α + c) (0: off).")] = 0.25
    char_encoder: Annotated[Literal["cnn", "lstm"], Field(description="BiLSTM: the spelling encoder: a char CNN "
                                                                      "(max-pooled convolutions) or a char BiLSTM "
                                                                      "(its last states).")] = "cnn"
    char_dim: int = 32
    char_filters: int = 64  # cnn: filters per width
    char_kernels: tuple[int, ...] = (2, 3, 4)  # cnn: widths
    char_hidden: int = 64  # lstm: size per direction
    hmm_features: Annotated[bool, Field(description="BiLSTM: add the tag an HMM tagger predicts for each word as an "
                                                    "input (stacking; on the training set the HMMs of the other "
                                                    "`hmm_folds` folds predict, so training sees the HMM's "
                                                    "errors as tagging will).")] = True
    hmm_folds: int = 5
    hidden_dim: Annotated[int, Field(ge=4, le=4096, description="BiLSTM: LSTM size per direction.")] = 150
    num_layers: Annotated[int, Field(ge=1, le=8, description="BiLSTM: stacked bidirectional layers.")] = 2
    bidirectional: bool = True  # False: a left-to-right LSTM (the baseline the notes contrast)
    dropout: float = 0.33
    aux_weight: float = 1.0  # loss weight of the second tag column, when items carry one (0: ignore it)
    elmo: bool = False  # mix a frozen biLM's layers into the input (fit(..., bilm=...))
    elmo_dropout: float = 0.5
    tag_batch_size: int = 256
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=30, batch_size=32, lr=2e-3,
                                                                    clip_grad_norm=5.0, patience=5,
                                                                    warmup_steps=100, min_lr_ratio=0.05))

    def validate(self) -> None:
        check(self)
        checks = [
            ("word_dim", self.word_dim >= 1, "use 1 or more"), ("hidden_dim", self.hidden_dim >= 1, "use 1 or more"),
            ("num_layers", self.num_layers >= 1, "use 1 or more"),
            ("dropout", 0 <= self.dropout < 1, "use a fraction in [0, 1)"),
            ("elmo_dropout", 0 <= self.elmo_dropout < 1, "use a fraction in [0, 1)"),
            ("word_dropout_alpha", self.word_dropout_alpha >= 0, "use 0 (off) or more"),
            ("aux_weight", self.aux_weight >= 0, "use 0 (no second head) or more"),
            ("char_kernels", len(self.char_kernels) > 0 and min(self.char_kernels) >= 1, "use widths >= 1"),
            ("char_hidden", self.char_hidden >= 1, "use 1 or more"),
            ("hmm_folds", self.hmm_folds >= 2, "use 2 or more folds"),
            ("tag_batch_size", self.tag_batch_size >= 1, "use 1 or more"),
        ]
        for name, ok, fix in checks:
            if not ok:
                raise ParameterError(f"TaggerConfig.{name}={getattr(self, name)!r} is invalid: {fix}")
        self.train.validate()
