"""Where and how precisely a training or scoring step runs: the data-parallel rank, bf16 autocast, TF32
matmuls, and batches copied to the device from pinned memory without blocking (`models.lm.train`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the initialised torch.distributed group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CUDA by default (`auto`); `bf16` forces it on CPU too (same code path)."""
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU batch on `device`. On CUDA it is copied from pinned (page-locked) memory with `non_blocking`:
    the host goes on preparing the next step while the copy runs (torch keeps the pinned block until the
    copy is done)."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@contextmanager
def tf32_matmuls(device: torch.device) -> Iterator[None]:
    """On CUDA, let fp32 matmuls and convolutions use TF32 tensor cores (10-bit mantissa products, fp32
    sums: what bf16 autocast leaves in fp32, and fp32 runs) while the loop runs; the setting is restored after."""
    if device.type != "cuda":
        yield
        return
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn
