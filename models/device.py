"""Where torch work runs: one rule for every trainer (GloVe, the neural LMs)."""

from __future__ import annotations

import os
import platform
from functools import cache
from typing import TYPE_CHECKING, Annotated

from lexiflow.models.errors import ParameterError
from pydantic import Field

if TYPE_CHECKING:
    import torch

# The device parameter of every trainer (models/config.py).
Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto picks CUDA when present.")]


def resolve_device(device: str, parameter: str = "device") -> torch.device:
    """'auto' → CUDA when present, else CPU; an explicit CUDA device must exist (`parameter` names
    the setting in errors). Under torchrun (several ranks) a bare 'cuda' is this rank's GPU."""
    import torch  # here: the `Device` parameter is declared without torch (models/lm/config.py)

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


@cache
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def describe(dev: torch.device | str, precision: str, count: int = 1) -> dict:
    """What a training ran on, for its manifest and the report: device type, name (the GPU's, or the
    CPU model), how many (GPUs of a data-parallel run; 1 on CPU, with its torch threads), precision
    (`fp32`, `bf16` autocast, ...). "auto" resolves as the trainers resolve it."""
    import torch

    dev = resolve_device(dev) if isinstance(dev, str) else dev
    if dev.type == "cuda":
        return {"type": "cuda", "name": torch.cuda.get_device_name(dev), "count": count, "precision": precision}
    return {"type": dev.type, "name": _cpu_name(), "count": 1, "threads": torch.get_num_threads(),
            "precision": precision}


def lm_precision(dev: torch.device, precision: str) -> str:
    """The neural LMs' effective precision (`models.lm.train.autocast`'s rule)."""
    return "bf16" if precision == "bf16" or (precision == "auto" and dev.type == "cuda") else "fp32"


def gpu_warning(environ: dict[str, str] | None = None) -> str | None:
    """A warning when this process is meant for a GPU (CUDA_VISIBLE_DEVICES names one) but torch sees
    none: training with device=auto would run on the CPU without a word."""
    import torch

    visible = (environ if environ is not None else os.environ).get("CUDA_VISIBLE_DEVICES", "")
    if not visible or torch.cuda.is_available():
        return None
    return (f"CUDA_VISIBLE_DEVICES={visible} but torch sees no CUDA GPU here (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda or 'none'}): device=auto trains on the CPU")
