"""Multi-process data-parallel training of any neural LM: torch DistributedDataParallel (Li et al. 2020,
"PyTorch Distributed: Experiences on Accelerating Data Parallel Training"), launched with `torchrun`.

    fit_distributed(lm, train, valid, world_size=4, workdir=...)
      -> writes the job (model config, TrainConfig, token ids) into `workdir`
      -> runs `python -m torch.distributed.run --standalone --nproc_per_node 4 -m models.lm.distributed workdir`
         every rank: init the process group (NCCL on CUDA, gloo on CPU), build the same model (same seed),
         `lm.fit` (the loop in `models.lm.train` trains this rank's rows of every batch, DDP averages
         the gradients); rank 0 writes `workdir/model` (an `lm` directory) and `workdir/steps.json`
         (the global loss of every step)
      <- loads `workdir/model` and returns it

One machine, one process per GPU (`LOCAL_RANK` picks `cuda:<rank>`); on CPU the same code runs with
gloo (how CI tests it). `batch_size` is the global batch: each rank trains batch_size / world_size
rows, so the loss curve matches a one-process run at the same batch size. Checkpoints
(`TrainConfig.checkpoint_dir`, shared by the ranks) hold every rank's rows, so a killed job resumes.
Job files are `.npy` (allow_pickle=False), JSON and safetensors; no pickle crosses processes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from lexiflow.models.errors import ParameterError
from lexiflow.models.lm import registry
from lexiflow.models.lm.neural import NeuralLM, from_dict
from lexiflow.models.lm.train import TrainConfig

logger = logging.getLogger("lexiflow.lm.distributed")
OWNER_ENV = "LEXIFLOW_DDP_OWNER_PID"  # the process that launched torchrun; the ranks stop when it is gone


def _write_sentences(path: Path, sentences: Sequence[np.ndarray]) -> None:
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    flat = np.concatenate([np.asarray(s, dtype=np.int64).ravel() for s in sentences]) if len(sentences) else \
        np.zeros(0, dtype=np.int64)
    np.save(path.with_suffix(".ids.npy"), flat, allow_pickle=False)
    np.save(path.with_suffix(".lengths.npy"), lengths, allow_pickle=False)


def _read_sentences(path: Path) -> list[np.ndarray]:
    flat = np.load(path.with_suffix(".ids.npy"), allow_pickle=False)
    lengths = np.load(path.with_suffix(".lengths.npy"), allow_pickle=False)
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_with_launchers() -> None:
    """End this rank once torchrun or the process that started it (the `lm` stage) is gone. A SIGKILL
    there (OOM killer, a cancelled run) releases the stage's build lock but not its children: left
    running, the ranks would go on writing the checkpoint folder beside the rerun the lock now lets in."""
    torchrun, owner = os.getppid(), int(os.environ.get(OWNER_ENV, "0"))

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != torchrun or (owner and not _alive(owner)):
                os._exit(1)  # checkpoints are swapped in whole: stopping anywhere leaves a usable one

    threading.Thread(target=watch, name="lexiflow-launcher-watch", daemon=True).start()


def torchrun_command(world_size: int, workdir: Path) -> list[str]:
    """The launch command (one node; a free rendezvous port chosen by torchrun --standalone)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}",
            "-m", "lexiflow.models.lm.distributed", str(workdir)]


def fit_distributed(lm: NeuralLM, train_sentences: Sequence[np.ndarray],
                    valid_sentences: Sequence[np.ndarray] | None, *, world_size: int, workdir: str | Path,
                    device: str = "cpu") -> NeuralLM:
    """Train `lm` (unfitted; its config, TrainConfig and pretrained embeddings) on `world_size` processes;
    return the trained model loaded on `device`. Raises RuntimeError with the ranks' last log lines on failure."""
    if world_size < 1:
        raise ParameterError(f"world_size={world_size}: use 1 or more processes")
    if lm.train.batch_size % world_size:
        raise ParameterError(f"batch_size={lm.train.batch_size} is not divisible by world_size={world_size}: "
                             "use a multiple of the number of processes (each trains an equal share)")
    if lm.train.device.startswith("cuda") or (lm.train.device == "auto" and torch.cuda.is_available()):
        if torch.cuda.device_count() < world_size:
            raise ParameterError(f"world_size={world_size} but this machine has {torch.cuda.device_count()} "
                                 "GPU(s): one process per GPU; lower world_size or set device='cpu'")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    job = {"kind": lm.kind, "config": asdict(lm.config), "train": asdict(lm.train),
           "valid": valid_sentences is not None}
    (workdir / "job.json").write_text(json.dumps(job, indent=1))
    _write_sentences(workdir / "train", train_sentences)
    if valid_sentences is not None:
        _write_sentences(workdir / "valid", valid_sentences)
    if lm.embeddings is not None:
        np.save(workdir / "embeddings.npy", np.asarray(lm.embeddings, dtype=np.float32), allow_pickle=False)
    env = {**os.environ, OWNER_ENV: str(os.getpid())}  # the ranks import the installed lexiflow package
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default too: W ranks share the cores
    logger.info("launching %d ranks: %s", world_size, " ".join(torchrun_command(world_size, workdir)))
    tail: deque[str] = deque(maxlen=40)
    with subprocess.Popen(torchrun_command(world_size, workdir), cwd=workdir, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:  # the ranks' logs, forwarded (Prefect picks up the lexiflow logger)
            tail.append(line.rstrip())
            logger.info("%s", line.rstrip())
    if proc.returncode != 0:
        raise RuntimeError(f"distributed training ({world_size} ranks) exited {proc.returncode}:\n" + "\n".join(tail))
    return registry.load(workdir / "model", device)


def worker(workdir: Path) -> None:
    """One rank (run by torchrun): train with the process group up; rank 0 saves the model and step losses."""
    import torch.distributed as dist

    _stop_with_launchers()
    job = json.loads((workdir / "job.json").read_text())
    kind_cls = registry.neural_class(job["kind"], workdir / "job.json")
    config = from_dict(kind_cls.config_class, job["config"], workdir / "job.json")
    train = from_dict(TrainConfig, job["train"], workdir / "job.json")
    on_cuda = train.device.startswith("cuda") or (train.device == "auto" and torch.cuda.is_available())
    dist.init_process_group("nccl" if on_cuda else "gloo")
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(name)s: %(message)s")
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    embeddings_file = workdir / "embeddings.npy"
    embeddings = np.load(embeddings_file, allow_pickle=False) if embeddings_file.exists() else None
    steps: list[list[float]] = []
    try:
        lm = kind_cls(config, train, embeddings).fit(
            _read_sentences(workdir / "train"), _read_sentences(workdir / "valid") if job["valid"] else None,
            on_step=lambda step, loss: steps.append([step, loss]))
        if rank == 0:
            lm.save(workdir / "model")
            (workdir / "steps.json").write_text(json.dumps(steps))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
