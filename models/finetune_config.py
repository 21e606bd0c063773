"""Fine-tuning's configuration, apart from its torch code (models/finetune.py): the pipeline derives its
parameters without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from lexiflow.models.config import check
from lexiflow.models.errors import ParameterError
from pydantic import Field

MODES = ("full", "frozen", "adapters", "lora")


# Peak learning rates tried per mode, the best kept on dev accuracy (the benchmark and the pipeline alike; a
# from-scratch body gets full's grid). The modes that train few weights take larger steps; pretrained bodies, whose
# embeddings grew in pretraining, may want smaller ones than a random body.
LR_GRID = {"full": (3e-4, 1e-3, 3e-3), "frozen": (1e-3, 3e-3, 1e-2), "adapters": (1e-3, 3e-3, 1e-2),
           "lora": (1e-3, 3e-3, 1e-2)}


# The frozen body's dropout while LoRA trains, chosen on dev (the pipeline tries its rates with the first and the
# rest at the best rate; the benchmark tries every pair): None, the body's own, or none at all. LoRA overfits 10 % of
# EWT train and keeps dropout; it underfits all of it, where dropping it gains 0.5 to 0.8 points
# (benchmarks/results/lora_sweep-notes.md)
LORA_BODY_DROPOUTS = (None, 0.0)


@dataclass
class FineTuneConfig:
    """How a pretrained body is adapted to a task. Annotated fields are pipeline parameters."""

    mode: Literal["full", "frozen", "adapters", "lora"] = "full"  # what trains besides the head (pipeline: each)
    # Chosen on EWT dev UPOS at 100 % of EWT train (benchmarks/results/lora_sweep-notes.md): r 8 on the linear maps,
    # r 7 on the token embedding's rows the training data holds: 4.8 % of the default encoder's weights on all of
    # EWT train. α / r = 8: with B = 0 at init and Adam, the scale sets how fast B moves against A (LoRA+, Hayou et
    # al. 2024)
    lora_rank: Annotated[int, Field(ge=1, le=256, description="LoRA rank r.")] = 8
    lora_alpha: Annotated[float, Field(gt=0, description="LoRA scale α (updates weigh α / r).")] = 64.0
    lora_embedding_rank: Annotated[int, Field(ge=1, le=256, description=(
        "LoRA rank of the token embedding (lora_targets all), on the ids the training data holds; its updates "
        "weigh α / r too."))] = 7
    lora_max_share: Annotated[float, Field(gt=0, le=1, description=(
        "The largest share of the model's weights LoRA trains (with the head): smaller models get lower ranks "
        "(r and the embedding's together, α / r kept)."))] = 0.05
    lora_body_dropout: float | None = None  # dropout in the frozen body while LoRA trains; None: the body's own
    # every linear map by default, the token embedding included: with the embedding frozen, even full fine-tuning
    # of the rest trailed full fine-tuning by 6 points of UPOS at 10 % of EWT, LoRA by 8
    # (benchmarks/results/lora_sweep-notes.md)
    lora_targets: Annotated[Literal["attention", "linear", "all"], Field(description=(
        "LoRA's layers: attention (W^Q, W^K, W^V, W^O, Hu et al.), linear (also the feed-forward layers) or all "
        "(also the token embedding)."))] = "all"
    adapter_size: Annotated[int, Field(ge=1, le=4096, description="Adapter bottleneck width.")] = 16
    head_dropout: Annotated[float, Field(ge=0, lt=1, description="Dropout before the task head.")] = 0.1

    def validate(self) -> None:
        check(self)
        if self.mode not in MODES:
            raise ParameterError(f"FineTuneConfig.mode={self.mode!r}: use one of {', '.join(MODES)}")
