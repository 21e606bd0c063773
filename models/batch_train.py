"""Training over mini-batches of whole sentences (taggers, the ELMo biLM), on `models.lm.train`'s parts.

The LM loop (`models.lm.train.train`) walks one token stream in bptt windows; a tagger and a
bidirectional LM need whole sentences (the backward direction reads from the sentence's end). This
loop keeps everything else of that loop — `TrainConfig`, the AdamW/SGD optimizer, warmup + cosine
schedule, gradient clipping, bf16 autocast on CUDA, the device rule, safetensors checkpoints with
optimizer moments and RNG state, progress with rate and ETA, early stopping with the best epoch's
weights restored — and only replaces the data walk:

- each epoch visits every sentence once in an order drawn from `seed + epoch` (so a resumed run
  redraws the same order): a random permutation cut into pools of 50 batches, each pool sorted by
  length (little padding) and cut into batches, the batches shuffled;
- `batch_loss(indices)` returns (summed loss, count) for those sentences; the loss optimised is
  their mean;
- `score()` after each epoch returns the dev metric, higher is better (tagging accuracy, or minus
  the biLM's dev loss); patience counts epochs without a gain.

A checkpoint every `checkpoint_every` steps and at each epoch end holds the position (epoch, batch),
so a killed run resumes at the next batch and ends where an uninterrupted run would.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm.train import (
    Position,
    StopTraining,
    TrainConfig,
    autocast,
    clip_grad_norm,
    find_checkpoint,
    load_checkpoint,
    load_module_tensors,
    lr_at,
    make_optimizer,
    module_tensors,
    save_checkpoint,
)
from lexiflow.models.progress import Progress

__all__ = ["StopTraining", "TrainConfig", "epoch_batches", "train_sentences"]

logger = logging.getLogger("lexiflow.batch_train")

POOL = 50  # batches per length-sorted pool


def epoch_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """This epoch's batches of sentence indices (deterministic in seed and epoch)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    lens = np.asarray(lengths)
    batches: list[np.ndarray] = []
    pool = batch_size * POOL
    for lo in range(0, len(order), pool):
        chunk = order[lo : lo + pool]
        chunk = chunk[np.argsort(lens[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def train_sentences(module: torch.nn.Module, lengths: Sequence[int],
                    batch_loss: Callable[[np.ndarray, torch.device], tuple[torch.Tensor, int]],
                    cfg: TrainConfig, *, score: Callable[[], float] | None = None, name: str = "train",
                    on_step: Callable[[int, float], None] | None = None) -> list[dict]:
    """Train `module` in place; return one row per epoch (train loss, dev score, tokens/s, seconds).

    `lengths`: tokens per training sentence (for batching and progress). `batch_loss(indices, device)`
    runs the module under the loop's autocast and returns (summed loss, items counted).
    `on_step(step, loss)` after every optimizer step (raise StopTraining to simulate a kill).
    """
    cfg.validate()
    if len(lengths) == 0:
        raise ParameterError(f"{name}: no training sentences; give at least one")
    device = resolve_device(cfg.device, f"{name}.device")
    module.to(device)
    module.train()
    per_epoch = math.ceil(len(lengths) / cfg.batch_size)
    total_steps = cfg.epochs * per_epoch if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * per_epoch)
    opt = make_optimizer(module, cfg)
    pos, history, best = Position(), [], None
    pos.best_valid = math.inf  # minus the best dev score
    ckpt = find_checkpoint(cfg.checkpoint_dir)
    if ckpt is not None:
        pos, _, history, best = load_checkpoint(ckpt, module, opt, device)
        logger.info("%s: resuming from %s at step %d (epoch %d, batch %d)", name, ckpt, pos.step, pos.epoch + 1,
                    pos.batch)
    ckpt_path = Path(cfg.checkpoint_dir) / "checkpoint" if cfg.checkpoint_dir else None

    def checkpoint() -> None:
        if ckpt_path is not None:
            save_checkpoint(ckpt_path, module, opt, pos, (), history, best)

    tokens_per_epoch = int(np.sum(lengths))
    progress = Progress(name, total=total_steps / per_epoch * tokens_per_epoch, unit="tokens",
                        every_s=cfg.log_every_s, done=pos.step / per_epoch * tokens_per_epoch)
    lens = np.asarray(lengths)
    while not pos.done and pos.epoch < cfg.epochs and pos.step < total_steps:
        t0 = time.perf_counter()
        module.train()
        for b, idx in enumerate(epoch_batches(lengths, cfg.batch_size, cfg.seed, pos.epoch)):
            if b < pos.batch:
                continue  # resumed mid-epoch: done before the kill
            if pos.step >= total_steps:
                break
            for group in opt.param_groups:
                group["lr"] = lr_at(pos.step, cfg, total_steps)
            with autocast(device, cfg.precision):
                total, n = batch_loss(idx, device)
            loss = total.float() / max(n, 1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_grad_norm is not None:
                clip_grad_norm([p for p in module.parameters() if p.requires_grad], cfg.clip_grad_norm)
            opt.step()
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise ParameterError(f"{name}: training diverged at step {pos.step + 1} (loss {loss_value}): "
                                     "lower the learning rate or set clip_grad_norm")
            tokens = int(lens[idx].sum())
            pos.step, pos.batch = pos.step + 1, b + 1
            pos.epoch_loss, pos.epoch_count = pos.epoch_loss + loss_value * n, pos.epoch_count + n
            pos.epoch_tokens += tokens
            progress.update(tokens)
            if cfg.checkpoint_every and pos.step % cfg.checkpoint_every == 0:
                now = time.perf_counter()
                pos.epoch_seconds, t0 = pos.epoch_seconds + now - t0, now  # checkpoint time is not training time
                checkpoint()
            if on_step is not None:
                on_step(pos.step, loss_value)
        pos.epoch_seconds += time.perf_counter() - t0
        module.eval()
        dev = score() if score is not None else None
        history.append({"epoch": pos.epoch + 1, "step": pos.step,
                        "train_loss": pos.epoch_loss / max(pos.epoch_count, 1), "dev_score": dev,
                        "tokens_per_s": pos.epoch_tokens / max(pos.epoch_seconds, 1e-9),
                        "seconds": pos.epoch_seconds})
        logger.info("%s: epoch %d, train loss %.4f, dev %s, %.0f tokens/s", name, pos.epoch + 1,
                    history[-1]["train_loss"], f"{dev:.4f}" if dev is not None else "-", history[-1]["tokens_per_s"])
        if dev is not None:
            if -dev < pos.best_valid:
                pos.best_valid, pos.bad_epochs = -dev, 0
                best = {k: v.clone() for k, v in module_tensors(module).items()}
            else:
                pos.bad_epochs += 1
                if cfg.patience is not None and pos.bad_epochs >= cfg.patience:
                    logger.info("%s: early stopping after epoch %d (%d epochs without a dev gain)", name,
                                pos.epoch + 1, pos.bad_epochs)
                    pos.done = True
        pos.epoch += 1
        pos.batch = 0
        pos.epoch_loss, pos.epoch_count, pos.epoch_tokens, pos.epoch_seconds = 0.0, 0, 0, 0.0
        checkpoint()
    progress.close()
    if best is not None:
        load_module_tensors(module, best, "best weights")  # early stopping keeps the best epoch
    module.eval()
    return history
