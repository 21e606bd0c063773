"""The device check in one command: the CUDA tests, the gpu benchmark and a bf16 MLM run, results with their device.

    python -m benchmarks device                 # here (a GPU machine with the project's environment, or the CPU)
    python -m benchmarks.device --pack          # a lent GPU machine without a registry: .devkit/device/ (< 64 MiB)
    bash benchmarks/device.sh                   # there, from the repository's root, .devkit carried

1. `tests/test_cuda.py`, run from a copy of `tests/` outside the checkout (the repository's `lexiflow/` folder
   would shadow the installed package), with the shared data the tests read beside the copy.
2. `benchmarks/gpu.py` (lexiflow vs the nanoGPT-style reference, tokens/s and MFU; MLM, seq2seq, tagger, GloVe).
3. The MLM pretraining of `benchmarks/finetune.py` (same WordPiece ids, size and optimisation) in bf16 autocast,
   through step `MLM_STEPS`, past the step 1650 where it used to diverge on an H200: the steps skipped for a
   non-finite loss or gradient (target 0: the cause is fixed, not only survived) and the final loss.
On the CPU the CUDA tests skip and the bf16 MLM run is a tiny one (CPU bf16 runs at ~250 tokens/s at the
benchmark's size): each such row says why. The rows go to benchmarks/results/device.{md,parquet} with the
device's name; the whole check's wall time is the last row.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from lexiflow.models.encoder import BERT_SPECIALS, EncoderConfig, EncoderModel, MLMTask, log_prior
from lexiflow.models.lm.train import StopTraining, TrainConfig, Trainer

from benchmarks import gpu
from benchmarks.harness import SHARED_DATA, Row

NAME = "device"
ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".devkit" / "device"
MLM_IDS = KIT / "mlm_ids.npz"  # the finetune benchmark's pretraining text as WordPiece ids (made by --pack)
MLM_STEPS = 2200  # the H200 run stopped with a NaN loss at step 1650 (FINETUNE_EPOCHS=20,3,3)
MLM_EPOCHS = 20  # its schedule: 20 epochs of cosine decay


def cuda_tests(shared: Path = SHARED_DATA.parent) -> Row:
    """pytest tests/test_cuda.py from a copy of tests/ in a temporary checkout, with `shared` beside it."""
    with tempfile.TemporaryDirectory() as tmp:
        checkout = Path(tmp) / "checkout"
        shutil.copytree(ROOT / "tests", checkout / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        if shared.exists():
            (Path(tmp) / "shared").symlink_to(shared.resolve())
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                               "tests/test_cuda.py"], cwd=checkout, capture_output=True, text=True, timeout=420)
        seconds = time.perf_counter() - start
    out = done.stdout + done.stderr
    print(out[-3000:], flush=True)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", out.splitlines()[-1])} \
        if out.strip() else {}
    passed, total = counts.get("passed", 0), sum(counts.values())
    case = "pytest tests/test_cuda.py (from a copy of tests/)"
    if not torch.cuda.is_available():  # a GPU part: each test skips, with its reason
        reason = re.search(r"SKIPPED \[\d+\] [^:]+:\d+: (.+)", out)
        return Row(NAME, case, "tests passed", passed, notes=f"GPU part skipped: {counts} in {seconds:.0f}s "
                                                             f"({reason.group(1) if reason else 'see the log'})")
    return Row(NAME, case, "tests passed", passed, total, "tests run", target="all pass",
               met=done.returncode == 0 and passed == total, notes=f"{counts} in {seconds:.0f}s")


def pretraining_ids() -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """(train ids, held-out ids, vocabulary size): from the kit when carried, else made as finetune.run makes them."""
    if MLM_IDS.exists():
        z = np.load(MLM_IDS)
        split = lambda name: np.split(z[f"{name}_tokens"].astype(np.int64), z[f"{name}_ends"][:-1])  # noqa: E731
        return split("train"), split("held"), int(z["vocab"])
    from lexiflow.models.tokenizers.wordpiece import WordPiece

    from benchmarks.finetune import MIN_PAIR_COUNT, VOCAB, pretraining_text

    train_text, held_text = pretraining_text(False)
    tok = WordPiece(vocab_size=VOCAB, min_frequency=MIN_PAIR_COUNT, special_tokens=BERT_SPECIALS).fit(train_text)

    def enc(texts: list[str]) -> list[np.ndarray]:  # finetune.run's: long lines in pieces that fit max_len 128
        out = [np.asarray(tok.encode(t), dtype=np.int64) for t in texts]
        return [ids[i:i + 126] for ids in out for i in range(0, len(ids), 126)]

    return enc(train_text), enc(held_text)[:500], tok.vocab_size


def bf16_mlm(quick: bool) -> list[Row]:
    """The finetune benchmark's MLM pretraining in bf16 through step MLM_STEPS (CUDA), or a tiny bf16 run (CPU)."""
    cuda = torch.cuda.is_available()
    if cuda:
        train, held, vocab = pretraining_ids()
        size = dict(d_model=128, n_layers=2, n_heads=4, d_ff=512, max_len=128)
        steps, epochs, batch, warmup = (300 if quick else MLM_STEPS), MLM_EPOCHS, 64, 300
        why = "benchmarks/finetune.py's MLM pretraining (its ids, size, lr 2e-3, 20-epoch cosine schedule)"
    else:
        rng = np.random.default_rng(0)
        train = [5 + (rng.integers(0, 20) + np.arange(rng.integers(3, 12))) % 20 for _ in range(256)]
        held, vocab = train[:32], 30
        size = dict(d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16)
        steps, epochs, batch, warmup = 40, 5, 32, 10
        why = ("tiny bf16 MLM on the CPU: the benchmark-size run is a GPU part (bf16 on this CPU ~250 tokens/s at "
               "d128: 2200 steps would take hours)")

    def stop(step: int, loss: float) -> None:  # keep the long schedule, stop at `steps`
        if step >= steps:
            raise StopTraining

    cfg = TrainConfig(epochs=epochs, batch_size=batch, lr=2e-3, warmup_steps=warmup, clip_grad_norm=1.0,
                      checkpoint_every=0, weight_decay=0.01, log_every_s=30, precision="bf16",
                      device="cuda" if cuda else "cpu")
    config = EncoderConfig(vocab_size=vocab, dropout=0.1, **size)
    torch.manual_seed(cfg.seed)  # MaskedLM.fit's set-up, with the trainer kept to stop it mid-schedule
    model = EncoderModel(config)
    with torch.no_grad():
        model.mlm_bias.copy_(log_prior(train, vocab))
    trainer = Trainer(model, MLMTask(train, held, config, cfg), cfg, name="mlm.pretrain", on_step=stop)
    start = time.perf_counter()
    try:
        trainer.run()
    except StopTraining:
        trainer.end_epoch()  # the stopped epoch's row: its loss, skipped steps, held-out loss
    seconds = time.perf_counter() - start
    skipped = sum(r["skipped_steps"] for r in trainer.history)
    case = f"MLM pretraining in bf16 autocast, {trainer.pos.step} steps, {'CUDA' if cuda else 'CPU'}"
    last = trainer.history[-1]
    notes = f"{why}; {seconds:.0f}s; train loss {last['train_loss']:.3f} in the last epoch"
    return [Row(NAME, case, "skipped steps (non-finite loss or gradient)", skipped, target="== 0", met=skipped == 0,
                higher_is_better=False, notes=notes),
            Row(NAME, case, "held-out masked-LM loss", last["valid_loss"], higher_is_better=False, notes=notes)]


def run(quick: bool = False) -> list[Row]:
    start = time.perf_counter()
    rows = [cuda_tests()]
    rows += gpu.run(quick)
    rows += bf16_mlm(quick)
    wall, limit = time.perf_counter() - start, 480 if torch.cuda.is_available() else 600
    rows.append(Row(NAME, "the whole device check", "wall seconds", wall, higher_is_better=False,
                    target=f"<= {limit}", met=wall <= limit,
                    notes="tests, gpu benchmark, bf16 MLM; Python's start and the results' writing not included"))
    return rows


# ---------------------------------------------------------------------------------------------
# the kit for a GPU machine without a registry (benchmarks/free_cores/pack.py's way)

# The GPU machine's packages, torch's own requirements with them.
ON_THE_MACHINE = {"numpy", "pyarrow", "scipy", "torch", "scikit-learn", "sacrebleu", "numba", "llvmlite", "pip",
                  "setuptools", "triton", "filelock", "jinja2", "markupsafe", "mpmath", "networkx", "sympy", "fsspec",
                  "typing-extensions"}


def needed_distributions() -> list[str]:
    """`name==version` of what the check needs that the GPU machine lacks: the distributions of the modules that
    importing it here loads (the CUDA tests with their conftest, the benchmarks; gensim as the free_cores stand-in,
    so none of its own needs), those imported inside functions (matplotlib: a saved LM's loss curve; pytest), and
    what they require."""
    from benchmarks.free_cores.pack import closure

    code = ("import sys; import tests.conftest, tests.test_cuda, benchmarks.device; "
            "print(' '.join({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)))")
    with tempfile.TemporaryDirectory() as tmp:
        for folder in ("tests", "benchmarks"):
            shutil.copytree(ROOT / folder, Path(tmp) / folder, ignore=shutil.ignore_patterns("__pycache__"))
        standin = Path(tmp) / "standin" / "gensim"
        standin.mkdir(parents=True)
        shutil.copy(ROOT / "benchmarks" / "free_cores" / "gensim_standin.py", standin / "__init__.py")
        modules = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": str(Path(tmp) / "standin")}).stdout.split()
    owners = metadata.packages_distributions()
    roots = {dist for m in modules for dist in owners.get(m, [])} - {"lexiflow", "gensim"}
    needed = closure(tuple(sorted(roots | {"matplotlib", "pytest"})))
    return [n for n in needed if re.sub(r"[-_.]+", "-", n.split("==")[0]).lower() not in ON_THE_MACHINE]


def pack() -> None:
    """.devkit/device/: site.tar.xz (the missing packages, cp312 wheels unpacked, gensim's stand-in), shared.tar.xz
    (the data the CUDA tests read), mlm_ids.npz (the bf16 MLM run's ids)."""
    from benchmarks.free_cores.pack import TARGET

    KIT.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        subprocess.run([*pip, "download", "--no-deps", *TARGET, "-d", wheels, *needed_distributions()], check=True)
        subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", site, *TARGET,
                        *sorted(wheels.glob("*.whl"))], check=True)
        for path in [*site.rglob("tests"), *site.rglob("__pycache__")]:
            shutil.rmtree(path, ignore_errors=True)
        (site / "gensim").mkdir()
        shutil.copy(ROOT / "benchmarks" / "free_cores" / "gensim_standin.py", site / "gensim" / "__init__.py")
        subprocess.run(f"tar -C {site} -cf - . | xz -9 -T0 > {KIT / 'site.tar.xz'}", shell=True, check=True)
        data = Path(tmp) / "shared" / "data"  # what tests/test_cuda.py reads
        (data / "ud-english-ewt").mkdir(parents=True)
        shutil.copy(SHARED_DATA / "ud-english-ewt" / "en_ewt-ud-dev.conllu", data / "ud-english-ewt")
        (data / "tatoeba-eng-fra").mkdir()
        lines = (SHARED_DATA / "tatoeba-eng-fra" / "train.tsv").read_text(encoding="utf-8").splitlines(True)[:300]
        (data / "tatoeba-eng-fra" / "train.tsv").write_text("".join(lines), encoding="utf-8")
        subprocess.run(f"tar -C {tmp} -cf - shared | xz -9 > {KIT / 'shared.tar.xz'}", shell=True, check=True)
    train, held, vocab = pretraining_ids()
    np.savez_compressed(MLM_IDS, vocab=vocab, **{f"{name}_{part}": value for name, ids in (("train", train),
                        ("held", held)) for part, value in (("tokens", np.concatenate(ids).astype(np.int16)),
                                                           ("ends", np.cumsum([len(s) for s in ids])))})
    print(*(f"{p.name}: {p.stat().st_size / 2**20:.1f} MiB" for p in sorted(KIT.iterdir())), sep="\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", action="store_true", help="make .devkit/device/ for a GPU machine")
    if parser.parse_args().pack:
        pack()
    else:
        parser.print_help()
