"""The one training loop for every neural LM (and the taggers, the biLM, seq2seq and the encoder): schedule,
optimizer steps, early stopping, progress; its tasks say what it trains on.

Its parts: the data layout and LM scoring (`models.lm.stream`), devices, precision and data-parallel ranks
(`models.lm.precision`), weights and checkpoints (`models.lm.checkpoints`), the network interface
(`models.lm.module`). The names callers use from them are imported here too (`from lexiflow.models.lm.train
import IGNORE, autocast, ...`).

Optimisation: AdamW (Loshchilov & Hutter 2019) or SGD (+momentum), linear warmup then cosine decay
(Loshchilov & Hutter 2017), gradient-norm clipping (Pascanu et al. 2013), bf16 autocast on CUDA,
optional `torch.compile`.

Speed on a GPU: a step never waits for the device. Batches are copied from pinned memory without
blocking; the loss, its count and the skipped steps are summed on the device and read back only at a
log line (every `log_every_s`), a checkpoint, an epoch's end, every `max_nonfinite_steps` steps, or for
an `on_step` callback; the optimizers are torch's fused kernels, which take the step's "skip" flag on
the device; fp32 matmuls may use TF32 while the loop runs.

Non-finite steps: a step whose loss or gradient norm is inf or NaN (a bf16 overflow, one bad batch)
changes nothing (weights, moments and step counts stay as they were); it is counted (`skipped_steps`
in the epoch's row) and logged. Only `max_nonfinite_steps` such steps in a row stop the run, with one
line saying what to change. Checkpoints (`models.lm.checkpoints`) every `checkpoint_every` steps and at
each epoch end let a killed run resume where it stopped and end where an uninterrupted run would.

Data parallelism (torch DistributedDataParallel; launched by `models.lm.distributed` through
`torchrun`): when a process group is initialised, rank r of W trains rows [r B/W, (r+1) B/W) of the
same batchified stream (its shard of every batch), the loss is scaled so that DDP's gradient average
equals the one-process gradient of the global batch, validation rows are split across ranks and
summed, and only rank 0 logs progress and writes checkpoints (holding every rank's carried state and
RNG state, gathered), so W processes at global batch B follow the loss curve of one process at B.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lexiflow.models.device import resolve_device
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm.checkpoints import (
    Position,
    find_checkpoint,
    gather_rng,
    gather_rows,
    load_checkpoint,
    load_module_tensors,
    module_tensors,
    save_checkpoint,
)
from lexiflow.models.lm.config import TrainConfig
from lexiflow.models.lm.module import LMModule
from lexiflow.models.lm.precision import autocast, dist_info, tf32_matmuls, to_device
from lexiflow.models.lm.stream import IGNORE, batchify, evaluate, flat_logits, targets_of, windows
from lexiflow.models.progress import Progress
from lexiflow.models.threads import limit_threads

logger = logging.getLogger("lexiflow.lm.train")





# ---------------------------------------------------------------------------------------------
# schedule


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Linear warmup over `warmup_steps`, then cosine from lr to lr*min_lr_ratio at `total_steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(module: torch.nn.Module, cfg: TrainConfig, sparse: bool = False) -> torch.optim.Optimizer:
    """AdamW or SGD as torch's fused kernels (one kernel for every parameter, on CUDA and the CPU; they skip
    a step on the device: `skip_step_unless`); with sparse gradients, which the fused kernels refuse, plain
    SGD's multi-tensor loop."""
    params = [p for p in module.parameters() if p.requires_grad]
    kernel = {"foreach": True} if sparse else {"fused": True}
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **kernel)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay,
                             **kernel)


def skip_step_unless(finite: torch.Tensor, opt: torch.optim.Optimizer) -> None:
    """`opt.step()` that changes nothing where the 0-dim bool `finite` is False, decided on the device.

    The fused kernels take GradScaler's `found_inf`: a non-zero value skips the update and leaves the moments
    and the step count as they were. The one non-fused case, plain SGD on sparse gradients (no momentum, no
    weight decay: `sparse_embedding_grads`), applies p -= lr * g: on the CPU the flag is read (host memory, no
    wait), on a GPU the gradients are zeroed where it is False, which changes nothing."""
    if opt.defaults.get("fused"):
        opt.grad_scale, opt.found_inf = None, (~finite).float()
    elif finite.device.type == "cpu":
        if not finite.item():
            return
    else:
        for p in (p for group in opt.param_groups for p in group["params"] if p.grad is not None):
            (p.grad._values() if p.grad.is_sparse else p.grad).masked_fill_(~finite, 0.0)
    opt.step()


def sparse_embedding_grads(module: torch.nn.Module, cfg: TrainConfig, world: int) -> bool:
    """Whether this run gives the input embedding sparse gradients (`cfg.sparse_grads`).

    A batch uses a few hundred of the V embedding rows, but a dense gradient is a fresh V×d matrix
    every step that is zeroed, scattered into, clipped and applied whole (~6% of an LSTM step at
    V = 13k, more with larger vocabularies). Only plain SGD applies a sparse gradient as it is:
    AdamW, momentum and weight decay keep dense state per row, NCCL cannot all-reduce sparse
    tensors, torch.compile does not trace them, and a tied embedding also receives the decoder's
    dense gradient.
    """
    emb = getattr(module, "embedding", None)
    if not (cfg.sparse_grads and isinstance(emb, torch.nn.Embedding) and emb.weight.requires_grad
            and cfg.optimizer == "sgd" and cfg.momentum == 0 and cfg.weight_decay == 0 and world == 1
            and not cfg.compile):
        return False
    return not any(getattr(m, "weight", None) is emb.weight for m in module.modules() if m is not emb)  # tied


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` that also takes sparse gradients (coalesced first: a row a
    batch used twice is one row of the gradient, and it is the rows' norm that counts). Returns the total
    norm before clipping; `max_norm` None only measures it."""
    grads = []
    for p in parameters:
        if p.grad is not None:
            if p.grad.is_sparse:
                p.grad = p.grad.coalesce()
            grads.append(p.grad._values() if p.grad.is_sparse else p.grad)
    total = torch.nn.utils.get_total_norm(grads)
    if max_norm is not None:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))  # as torch's: no branch, no sync
    return total


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# the loop


class StopTraining(Exception):
    """Raise from an `on_step` callback to stop at once (what a kill looks like to the loop)."""


class TrainTask:
    """What the loop trains on: the batches of each epoch, the loss of one batch, the validation score.

    The loop (`Trainer`) owns everything else: optimizer, schedule, clipping, autocast, checkpoints and
    resume, early stopping, progress, data parallelism's gradient averaging. A task's batches of an epoch
    must depend on the epoch number only (not on RNG state), so a resumed run walks the same batches.
    """

    tokens_per_step: float = 1.0  # input tokens of one global batch (progress and its ETA)
    # What `evaluate`'s mean is, for the log: "ppl" (an LM's NLL per token, logged as exp), "error" (a
    # tagger's error rate), "loss" (any other mean loss).
    valid_metric: str = "loss"

    def epoch_batches(self, epoch: int) -> Sequence[Any]:  # pragma: no cover
        raise NotImplementedError

    def loss(self, fwd: Callable, batch: Any, state: Any, device: torch.device,
             ) -> tuple[torch.Tensor, int, int, Any]:  # pragma: no cover
        """(summed NLL of this rank's rows (a tensor with a graph), predicted tokens in the global batch,
        input tokens in the global batch, the carried state). The counts are ints taken from the batch on the
        host: reading them off the device would wait for it every step."""
        raise NotImplementedError

    def evaluate(self, module: torch.nn.Module, device: torch.device, precision: str) -> tuple[float, int] | None:
        """(summed NLL, predicted tokens) on the validation data, or None without one."""
        return None


class LMStreamTask(TrainTask):
    """Next-token prediction on one batchified stream, in bptt windows with the state carried (see the
    module docstring); under data parallelism this rank's rows of every batch."""

    valid_metric = "ppl"

    def __init__(self, train_stream: np.ndarray, valid_stream: np.ndarray | None, cfg: TrainConfig, *,
                 bos_id: int, pad_id: int, window: int) -> None:
        rank, world = dist_info()
        self.full = batchify(train_stream, cfg.batch_size)
        rows = cfg.batch_size // world
        self.data = self.full[rank * rows : (rank + 1) * rows]  # this rank's shard (all of it in one process)
        if world > 1:
            logger.info("rank %d/%d trains rows %d-%d of %d", rank, world, rank * rows, (rank + 1) * rows - 1,
                        cfg.batch_size)
        self.valid = batchify(valid_stream, min(cfg.eval_batch_size, max(1, len(valid_stream) // 2))) \
            if valid_stream is not None else None
        self.bos_id, self.pad_id, self.window, self.world = bos_id, pad_id, window, world
        self.tokens_per_step = cfg.batch_size * window
        # Predicted tokens of the global batch up to each column, counted once here (every rank holds the whole
        # stream): a step's count costs no communication and no read of the device.
        per_column = (targets_of(self.full[:, 1:], bos_id, pad_id) != IGNORE).sum(0).numpy()
        self.predicted = np.concatenate(([0], np.cumsum(per_column)))

    def epoch_batches(self, epoch: int) -> list[tuple[int, int]]:
        return list(windows(self.data.shape[1], self.window))

    def loss(self, fwd, batch, state, device):
        i, length = batch
        x = to_device(self.data[:, i : i + length], device)
        y = to_device(targets_of(self.data[:, i + 1 : i + 1 + length], self.bos_id, self.pad_id), device)
        n = int(self.predicted[i + length] - self.predicted[i])
        if state is not None:
            state = tuple(s.detach() for s in state)  # truncated BPTT: keep the values, drop the graph
        logits, state = fwd(x, state)
        nll = F.cross_entropy(*flat_logits(logits.float(), y), ignore_index=IGNORE, reduction="sum")
        return nll, n, x.numel() * self.world, state

    def evaluate(self, module, device, precision):
        if self.valid is None:
            return None
        return evaluate(module, self.valid, self.window, device, precision, self.bos_id, self.pad_id)


def length_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, pool: int = 50) -> list[np.ndarray]:
    """The epoch's batches of item indices, shuffled, of similar lengths (little padding): a permutation
    drawn from (seed, epoch) cut into pools of `pool` batches, each sorted by length and cut into
    batches, the batches shuffled. Deterministic in seed and epoch, so a resumed run redraws them."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    lens = np.asarray(lengths)
    batches: list[np.ndarray] = []
    for lo in range(0, len(order), batch_size * pool):
        chunk = order[lo : lo + batch_size * pool]
        chunk = chunk[np.argsort(lens[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


class SentenceTask(TrainTask):
    """Batches of whole sentences (taggers, the biLM: a backward direction reads from the sentence's
    end) in `length_batches` order. `batch_loss(indices, device) -> (summed loss, items counted)`;
    `evaluate() -> (summed loss, count)` on dev, lower is better: a tagger gives (errors, tokens), so
    the loop's early stopping on `valid_loss` is early stopping on dev accuracy (`valid_metric="error"`)."""

    def __init__(self, lengths: Sequence[int], batch_loss: Callable[[np.ndarray, torch.device], tuple[Any, int]],
                 cfg: TrainConfig, evaluate: Callable[[], tuple[float, int]] | None = None,
                 name: str = "train", valid_metric: str = "loss") -> None:
        if len(lengths) == 0:
            raise ParameterError(f"{name}: no training sentences; give at least one")
        self.lengths, self.batch_loss, self.cfg, self._evaluate = np.asarray(lengths), batch_loss, cfg, evaluate
        self.valid_metric = valid_metric
        self.tokens_per_step = float(self.lengths.sum()) / math.ceil(len(self.lengths) / cfg.batch_size)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        return length_batches(self.lengths, self.cfg.batch_size, self.cfg.seed, epoch)

    def loss(self, fwd, batch, state, device):
        total, n = self.batch_loss(batch, device)
        return total.float(), n, int(self.lengths[batch].sum()), None

    def evaluate(self, module, device, precision):
        if self._evaluate is None:
            return None
        with torch.no_grad():
            return self._evaluate()


class Trainer:
    """The loop: `Trainer(module, task, cfg).run()` trains `module` in place and returns per-epoch rows.

    `step(batch)` is one optimizer step; `end_epoch()` scores validation, keeps the best weights, decides
    early stopping and checkpoints. `on_step(step, loss)` is called after every optimizer step with the
    global batch's mean loss (raise StopTraining to simulate a kill); reading it waits for the device each
    step. Inside a torch.distributed group every rank runs the same loop on its shard of each batch (see the
    module docstring).
    """

    def __init__(self, module: torch.nn.Module, task: TrainTask, cfg: TrainConfig, *, name: str = "lm.train",
                 on_step: Callable[[int, float], None] | None = None,
                 progress: Callable[[float | None], None] | None = None) -> None:
        cfg.validate()
        self.rank, self.world = dist_info()
        if cfg.batch_size % self.world:
            raise ParameterError(f"TrainConfig.batch_size={cfg.batch_size} is not divisible by the world size "
                                 f"{self.world}: use a multiple of the number of processes (the global batch is split "
                                 "evenly)")
        self.module, self.task, self.cfg, self.name, self.on_step = module, task, cfg, name, on_step
        self.device = device = resolve_device(cfg.device, "neural.device")
        module.to(device)
        module.train()
        if self.world > 1:
            torch.manual_seed(cfg.seed * 1000 + self.rank)  # independent dropout masks per rank (weights equal)
        per_epoch = len(task.epoch_batches(0))
        self.total_steps = cfg.epochs * per_epoch if not cfg.max_steps else min(cfg.max_steps,
                                                                                   cfg.epochs * per_epoch)
        self.embedding = getattr(module, "embedding", None)
        self.sparse = sparse_embedding_grads(module, cfg, self.world)
        self.opt = make_optimizer(module, cfg, self.sparse)
        if isinstance(self.embedding, torch.nn.Embedding):
            self.embedding.sparse = self.sparse  # set on every run: one that was killed may have left it on
        fwd = torch.compile(module) if cfg.compile else module
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            # Buffers (sinusoidal positions) never change: no per-step broadcast.
            fwd = DistributedDataParallel(fwd, device_ids=[device] if device.type == "cuda" else None,
                                          broadcast_buffers=False)
        self.fwd = fwd
        self.pos, self.history, self.best = Position(), [], None
        self.state: Any = None
        ckpt = find_checkpoint(cfg.checkpoint_dir)
        if ckpt is not None:
            self.pos, carried, self.history, self.best = load_checkpoint(ckpt, module, self.opt, device)
            self.state = carried if carried else None
            if self.rank == 0:
                logger.info("resuming from %s at step %d (epoch %d, batch %d)", ckpt, self.pos.step,
                            self.pos.epoch + 1, self.pos.batch)
        self.ckpt_path = Path(cfg.checkpoint_dir) / "checkpoint" if cfg.checkpoint_dir else None
        self.first_step = self.pos.step  # 0, or where the resumed run picks up
        self.progress = Progress(name, total=self.total_steps * task.tokens_per_step, unit="tokens",
                                 every_s=cfg.log_every_s if self.rank == 0 else math.inf,
                                 done=self.pos.step * task.tokens_per_step,
                                 callback=progress if self.rank == 0 else None)  # e.g. a Prefect progress artifact
        self._t0 = self._logged_at = time.perf_counter()
        # On the device, summed over the steps since the last `_flush`: NLL, predicted tokens, skipped steps.
        self._sums = torch.zeros(3, dtype=torch.float64, device=device)
        self._bad_run = torch.zeros((), dtype=torch.float64, device=device)  # non-finite steps in a row, now
        self._worst_run = torch.zeros((), dtype=torch.float64, device=device)  # ... and the longest since a read
        self._logged, self._warned = (0.0, 0), 0  # the epoch's (NLL, count) at the last log line; skips warned of

    def checkpoint(self) -> None:
        if self.ckpt_path is None:
            return
        self._flush()
        carry, rank_rng = self.state or (), None
        if self.world > 1:  # collective: every rank sends its rows and RNG state, rank 0 writes
            carry = gather_rows(carry, getattr(self.module, "state_batch_dim", 0))
            rank_rng = gather_rng(self.device)
        if self.rank == 0:
            save_checkpoint(self.ckpt_path, self.module, self.opt, self.pos, carry, self.history, self.best, rank_rng)

    def step(self, batch: Any) -> None:
        """One optimizer step on `batch`, skipped on the device when its loss or gradient is not finite."""
        pos, cfg, opt = self.pos, self.cfg, self.opt
        lr = lr_at(pos.step, cfg, self.total_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        with autocast(self.device, cfg.precision):
            nll, n, n_input, self.state = self.task.loss(self.fwd, batch, self.state, self.device)
        # DDP averages gradients over the W ranks: W * (rank's summed NLL) / n gives the global mean's gradient.
        loss = nll * (self.world / max(n, 1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = clip_grad_norm(self.module.parameters(), cfg.clip_grad_norm)  # of the averaged gradient under DDP
        nll = nll.detach()
        if self.world > 1:
            nll = nll.clone()
            dist.all_reduce(nll)  # the global batch's summed NLL, for the reported loss
        finite = torch.isfinite(nll) & torch.isfinite(norm)  # the same on every rank
        skip_step_unless(finite, opt)
        bad = (~finite).double()
        self._sums += torch.stack((torch.where(finite, nll.double(), 0.0), finite.double() * n, bad))
        self._bad_run = (self._bad_run + 1) * bad
        self._worst_run = torch.maximum(self._worst_run, self._bad_run)
        pos.step += 1
        pos.batch += 1
        pos.epoch_tokens += n_input
        self.progress.update(n_input)
        now = time.perf_counter()
        if pos.step % cfg.max_nonfinite_steps == 0:  # at the same step on every rank: all stop together
            self._read_back(check=True)
        if self.rank == 0 and now - self._logged_at >= cfg.log_every_s:
            self._logged_at = now
            self._read_back(log=True)
        if cfg.checkpoint_every and pos.step % cfg.checkpoint_every == 0:
            self._flush()  # waits for the device: its work up to here is training time
            self._lap()
            self.checkpoint()
        if self.on_step is not None:  # the one per-step read of the device, for a caller who asked
            self.on_step(pos.step, float(nll) / max(n, 1))

    def _flush(self) -> None:
        """Move the device's sums into `pos` (at checkpoints and epoch ends: the same steps in a resumed run as in
        an uninterrupted one, so their float sums agree), after checking the non-finite steps."""
        self._read_back(check=True)
        nll, count, skipped = self._sums.tolist()
        self._sums.zero_()
        self.pos.epoch_loss += nll
        self.pos.epoch_count += round(count)
        self.pos.epoch_skipped += round(skipped)

    def _read_back(self, check: bool = False, log: bool = False) -> None:
        """A read of the device's sums: warn of steps skipped since the last warning; with `check` (at steps every
        rank reaches alike) stop once `max_nonfinite_steps` steps in a row were non-finite; with `log`, log the
        train loss since the last log line."""
        nll, count, skipped, worst = torch.cat((self._sums, self._worst_run[None])).tolist()
        pos, limit = self.pos, self.cfg.max_nonfinite_steps
        total = (pos.epoch_loss + nll, pos.epoch_count + round(count), pos.epoch_skipped + round(skipped))
        if self.rank == 0 and total[2] > self._warned:
            logger.warning("%s: %d optimizer step(s) up to step %d skipped: non-finite loss or gradient (the weights "
                           "stay as they were)", self.name, total[2] - self._warned, pos.step)
            self._warned = total[2]
        if check:
            self._worst_run.zero_()
            if worst >= limit:
                raise ParameterError(f"training stopped at step {pos.step}: {int(worst)} steps in a row had a "
                                     f"non-finite loss or gradient (TrainConfig.max_nonfinite_steps={limit}); lower "
                                     "TrainConfig.lr, set clip_grad_norm, or train with precision='fp32'")
        if log and total[1] > self._logged[1]:
            logger.info("%s: step %d, train loss %.4f", self.name, pos.step,
                        (total[0] - self._logged[0]) / (total[1] - self._logged[1]))
            self._logged = total

    def _lap(self) -> None:
        """Add the time since the last lap to the epoch's training time (checkpoint writing is not training)."""
        now = time.perf_counter()
        self.pos.epoch_seconds += now - self._t0
        self._t0 = now

    def end_epoch(self) -> dict:
        """Validation, best weights, early stopping, the epoch's metrics row, a checkpoint."""
        pos, cfg = self.pos, self.cfg
        self._flush()  # waits for the device: its work up to here is training time
        self._lap()
        scored = self.task.evaluate(self.module, self.device, cfg.precision)
        row = epoch_row(pos, scored[0] / max(scored[1], 1) if scored is not None else None)
        valid_loss = row["valid_loss"]
        self.history.append(row)
        if self.rank == 0:
            logger.info("epoch %d: %s, %.0f tokens/s%s", row["epoch"], epoch_summary(row, self.task.valid_metric),
                        row["tokens_per_s"], f", {pos.epoch_skipped} steps skipped (non-finite)"
                        if pos.epoch_skipped else "")
        if valid_loss is not None:
            if valid_loss < pos.best_valid:
                pos.best_valid, pos.bad_epochs = valid_loss, 0
                self.best = {k: v.clone() for k, v in module_tensors(self.module).items()}
            else:
                pos.bad_epochs += 1
                if cfg.patience and pos.bad_epochs >= cfg.patience:
                    logger.info("early stopping after epoch %d (no improvement in %d epochs)", row["epoch"],
                                pos.bad_epochs)
                    pos.done = True
        pos.epoch += 1
        pos.batch = 0
        pos.epoch_loss, pos.epoch_count, pos.epoch_tokens, pos.epoch_seconds, pos.epoch_skipped = 0.0, 0, 0, 0.0, 0
        self._logged, self._warned = (0.0, 0), 0
        self.checkpoint()
        return row

    def run(self) -> list[dict]:
        with limit_threads(self.cfg.threads, "TrainConfig.threads"), tf32_matmuls(self.device):
            return self._run()

    def _run(self) -> list[dict]:
        pos = self.pos
        while not pos.done and pos.epoch < self.cfg.epochs and pos.step < self.total_steps:
            if pos.batch == 0:
                self.state = None  # each epoch starts afresh
            self.module.train()  # a task's evaluation may have left it in eval mode
            self._t0 = time.perf_counter()
            for batch in self.task.epoch_batches(pos.epoch)[pos.batch:]:  # resumed mid-epoch: skip what was done
                if pos.step >= self.total_steps:
                    break
                self.step(batch)
            self.end_epoch()
        if self.rank == 0:
            self.progress.close()
            logger.info("trained %d steps in this process (steps %d-%d of %d)", pos.step - self.first_step,
                        self.first_step + 1, pos.step, self.total_steps)
        if self.sparse:
            self.embedding.sparse = False
            self.embedding.weight.grad = None  # a later dense backward must not add to a sparse leftover
        if self.best is not None:
            load_module_tensors(self.module, self.best, "best weights")  # early stopping keeps the best epoch
        self.module.eval()
        return self.history


def epoch_row(pos: Position, valid_loss: float | None) -> dict:
    """The metrics row of the epoch `pos` ends (mean NLLs per predicted token, perplexities, throughput)."""
    train_loss = pos.epoch_loss / max(pos.epoch_count, 1)
    return {
        "epoch": pos.epoch + 1, "step": pos.step, "train_loss": train_loss, "train_ppl": perplexity(train_loss),
        "valid_loss": valid_loss, "valid_ppl": perplexity(valid_loss) if valid_loss is not None else None,
        "tokens_per_s": pos.epoch_tokens / max(pos.epoch_seconds, 1e-9), "seconds": pos.epoch_seconds,
        "skipped_steps": pos.epoch_skipped,
    }


def epoch_summary(row: dict, valid_metric: str) -> str:
    """The epoch log's figures, named for what they are: perplexities for an LM (`valid_metric` "ppl"), the
    dev error rate for a tagger ("error"), mean losses otherwise."""
    train = f"train ppl {row['train_ppl']:.2f}" if valid_metric == "ppl" else f"train loss {row['train_loss']:.4f}"
    if row["valid_loss"] is None:
        return train
    if valid_metric == "ppl":
        return f"{train}, valid ppl {row['valid_ppl']:.2f}"
    return f"{train}, valid {valid_metric} {row['valid_loss']:.4f}"


def train(module: LMModule, train_stream: np.ndarray, valid_stream: np.ndarray | None, cfg: TrainConfig, *,
          bos_id: int, pad_id: int, window: int,
          on_step: Callable[[int, float], None] | None = None,
          progress: Callable[[float | None], None] | None = None) -> list[dict]:
    """Train an LM `module` in place on the stream; return per-epoch metrics rows.

    `window` is the bptt length the module accepts (Transformer: min(bptt, max_len)).
    """
    cfg.validate()
    task = LMStreamTask(train_stream, valid_stream, cfg, bos_id=bos_id, pad_id=pad_id, window=window)
    return Trainer(module, task, cfg, on_step=on_step, progress=progress).run()


def perplexity(loss: float) -> float:
    """exp(mean NLL in nats); inf where that overflows a float (a diverged model, mean NLL > 709.8)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf

