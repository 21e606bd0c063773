"""Weights and checkpoints of the training loop (`models.lm.train`): safetensors + JSON (no pickle anywhere).

A checkpoint (every `checkpoint_every` steps and at each epoch end) holds the weights, optimizer moments, RNG
state, carried state and the position in the data, so a killed run resumes where it stopped and ends where an
uninterrupted run would (bit-for-bit on CPU). Under data parallelism rank 0 writes it, holding every rank's
carried state and RNG state, gathered; each rank reads back its own.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lexiflow.models.errors import InputError
from lexiflow.models.lm.module import LMModule
from lexiflow.models.lm.precision import dist_info
from safetensors.torch import load_file, save_file


def module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters (tied ones once: named_parameters drops aliases) and persistent buffers, on CPU."""
    out = {name: p.detach().cpu().contiguous() for name, p in module.named_parameters()}
    persistent = {k for k in module.state_dict() if k not in out}
    for name, b in module.named_buffers():
        if name in persistent:
            out[name] = b.detach().cpu().contiguous()
    return out


def load_module_tensors(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    # Tied aliases (lm_head.weight = embedding.weight) are saved once; they load through the shared tensor.
    aliases = {k for k in module.state_dict() if k not in tensors}
    if unexpected or set(missing) - aliases:
        raise InputError(f"{where} does not match the model config (missing {sorted(set(missing) - aliases)}, "
                         f"unexpected {sorted(unexpected)}): was it written by another model?")


@dataclass
class Position:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch (0-based)
    batch: int = 0  # windows done in the current epoch
    epoch_loss: float = 0.0  # summed NLL of the current epoch so far
    epoch_count: int = 0  # predicted tokens of the current epoch so far
    epoch_tokens: int = 0  # input tokens of the current epoch so far
    epoch_seconds: float = 0.0  # training time of the current epoch so far
    epoch_skipped: int = 0  # optimizer steps of the current epoch skipped for a non-finite loss or gradient
    best_valid: float = math.inf
    bad_epochs: int = 0
    done: bool = False


def gather_rows(state: tuple[torch.Tensor, ...], dim: int) -> tuple[torch.Tensor, ...]:
    """Every rank's carried state (its rows of the batch) concatenated along the batch dimension."""
    out = []
    for t in state:
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.detach().contiguous())
        out.append(torch.cat(parts, dim))
    return tuple(out)


def gather_rng(device: torch.device) -> dict[str, torch.Tensor]:
    """Every rank's RNG states (dropout masks differ per rank), as `rng.{cpu,cuda}.rank{r}` tensors."""
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    out = {}
    for name, st in states.items():
        parts = [torch.empty_like(st, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, st.to(device))
        out.update({f"rng.{name}.rank{r}": part.cpu() for r, part in enumerate(parts)})
    return out


def save_checkpoint(path: Path, module: torch.nn.Module, opt: torch.optim.Optimizer, pos: Position,
                     state: tuple[torch.Tensor, ...], history: list[dict], best: dict[str, torch.Tensor] | None,
                     rank_rng: dict[str, torch.Tensor] | None = None) -> None:
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(module_tensors(module), str(tmp / "model.safetensors"))
    extra: dict[str, torch.Tensor] = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        extra["rng.cuda"] = torch.cuda.get_rng_state()
    extra.update(rank_rng or {})
    for i, t in enumerate(state):
        extra[f"carry.{i}"] = t.detach().cpu().contiguous()
    scalars: dict[str, Any] = {}
    for idx, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                extra[f"opt.{idx}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{k}"] = v
    save_file(extra, str(tmp / "state.safetensors"))
    if best is not None:
        save_file(best, str(tmp / "best.safetensors"))
    meta = {"position": asdict(pos), "optimizer_scalars": scalars, "n_carry": len(state), "history": history}
    (tmp / "trainer.json").write_text(json.dumps(meta, indent=1))
    # Swap in atomically enough: a kill at any point leaves either `path` or `path.old` complete.
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(checkpoint_dir: str | None) -> Path | None:
    if checkpoint_dir is None:
        return None
    path = Path(checkpoint_dir) / "checkpoint"
    for p in (path, path.with_name(path.name + ".old")):
        if (p / "trainer.json").exists():
            return p
    return None


def load_checkpoint(path: Path, module: LMModule, opt: torch.optim.Optimizer, device: torch.device,
                     ) -> tuple[Position, tuple[torch.Tensor, ...], list[dict], dict[str, torch.Tensor] | None]:
    """Restore weights, optimizer, RNG and position; under data parallelism this rank's rows of the carried
    state and its own RNG state (checkpoints hold every rank's)."""
    meta = json.loads((path / "trainer.json").read_text())
    load_module_tensors(module, load_file(str(path / "model.safetensors")), str(path / "model.safetensors"))
    extra = load_file(str(path / "state.safetensors"))
    rank, world = dist_info()
    suffix = f".rank{rank}" if world > 1 and f"rng.cpu.rank{rank}" in extra else ""
    torch.set_rng_state(extra["rng.cpu" + suffix])
    if f"rng.cuda{suffix}" in extra and device.type == "cuda":
        torch.cuda.set_rng_state(extra[f"rng.cuda{suffix}"], device)
    state = tuple(extra[f"carry.{i}"] for i in range(meta["n_carry"]))
    if world > 1:  # this rank's rows of the batch
        state = tuple(t.chunk(world, module.state_batch_dim)[rank] for t in state)
    state = tuple(t.to(device) for t in state)
    opt_state: dict[int, dict[str, Any]] = {}
    for key, t in extra.items():
        if key.startswith("opt."):
            _, idx, k = key.split(".", 2)
            opt_state.setdefault(int(idx), {})[k] = t
    for key, v in meta["optimizer_scalars"].items():
        idx, k = key.split(".", 1)
        opt_state.setdefault(int(idx), {})[k] = v
    sd = opt.state_dict()
    opt.load_state_dict({"state": opt_state, "param_groups": sd["param_groups"]})
    best_path = path / "best.safetensors"
    best = load_file(str(best_path)) if best_path.exists() else None
    return Position(**meta["position"]), state, meta["history"], best
