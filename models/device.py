"""Where torch work runs: one rule for every trainer (GloVe, the neural LMs)."""

from __future__ import annotations

import os
from typing import Annotated

import torch
from lexiflow.models.errors import ParameterError
from pydantic import Field

# The device parameter of every trainer (models/config.py).
Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto picks CUDA when present.")]


def resolve_device(device: str, parameter: str = "device") -> torch.device:
    """'auto' → CUDA when present, else CPU; an explicit CUDA device must exist (`parameter` names
    the setting in errors). Under torchrun (several ranks) a bare 'cuda' is this rank's GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ParameterError(f"{parameter}={device!r}: not a torch device; "
                             "use 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ParameterError(f"{parameter}={device!r}, but torch sees no CUDA GPU on this machine: use 'auto' "
                             "(CUDA when present) or 'cpu', or train on a GPU worker (training.remote)")
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if dev.type == "cuda" and dev.index is None and distributed and torch.distributed.get_world_size() > 1:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))  # one GPU per rank
    return dev
