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


@dataclass
class FineTuneConfig:
    """How a pretrained body is adapted to a task. Annotated fields are pipeline parameters."""

    mode: Literal["full", "frozen", "adapters", "lora"] = "full"  # what trains besides the head (pipeline: each)
    # r = 8 (α = 16): ~1.3 % of the default encoder's parameters with a head, within the benchmark's 2 % budget
    lora_rank: Annotated[int, Field(ge=1, le=256, description="LoRA rank r.")] = 8
    lora_alpha: Annotated[float, Field(gt=0, description="LoRA scale α (updates weigh α / r).")] = 16.0
    # every linear layer by default: on the attention projections alone LoRA trailed full fine-tuning by several
    # points of UPOS (benchmarks/results/finetune.md), as QLoRA (Dettmers et al. 2023) found at larger scale
    lora_targets: Annotated[Literal["attention", "all"], Field(description=(
        "LoRA's layers: attention (W^Q, W^K, W^V, W^O, Hu et al.) or all (also the feed-forward layers)."))] = "all"
    adapter_size: Annotated[int, Field(ge=1, le=4096, description="Adapter bottleneck width.")] = 16
    head_dropout: Annotated[float, Field(ge=0, lt=1, description="Dropout before the task head.")] = 0.1

    def validate(self) -> None:
        check(self)
        if self.mode not in MODES:
            raise ParameterError(f"FineTuneConfig.mode={self.mode!r}: use one of {', '.join(MODES)}")
