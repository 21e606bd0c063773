"""Chaos machinery shared by tests/test_reliability.py and benchmarks/reliability.py: a Prefect
server for child processes, pipeline runs in child processes that can be killed with SIGKILL, the
crash loop, concurrent runs, and the store audit run after every kill.

Pipeline processes are forked from a "zygote" process that has imported lexiflow and Prefect once
(`python -m benchmarks.chaos zygote`): on two busy cores, importing them takes 10-20 s per process,
which would leave most random kill moments inside imports instead of inside stages. Each child
runs exactly what `lexiflow run ARGS` runs (`flows.cli.main`), so whatever stages `pipeline`
has are covered without change here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lexiflow.flows import prefect_env

ROOT = Path(__file__).resolve().parents[1]
# A small corpus and small parameters: a cold run takes seconds.
SMALL_RUN = ["--corpus", "builtin:lee", "--set", "svd.dim=20", "--set", "vocabulary.min_count=2",
             "--set", "evaluation.analogy_vocabulary=500", "--set", "evaluation.projection_words=0",
             "--set", 'embeddings=["svd"]', "--set", 'lm=["ngram"]']
_PUBLISHED = re.compile(r"(\w+): published \w+:([0-9a-f]{16})")
_REUSED = re.compile(r"(\w+): reusing \w+:([0-9a-f]{16})")
_CACHED = re.compile(r"Task run '(\w+)-[0-9a-f]+' - Finished in state Cached")  # Prefect's cache: same artifact
_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) \| .* (\w+): published ", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def prefect_server(home: Path, timeout: float = 180) -> Iterator[dict[str, str]]:
    """`prefect server start` on 127.0.0.1 with a private PREFECT_HOME; yields the environment
    children need (PREFECT_API_URL included). Stopped by its process id."""
    port = free_port()
    env = prefect_env.environment(home)
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "server.log", "wb")  # noqa: SIM115 (closed at teardown)
    prefect = Path(sys.executable).with_name("prefect")
    proc = subprocess.Popen([str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited ({proc.returncode}); see {home / 'server.log'}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prefect server not healthy after {timeout} s; see {home / 'server.log'}")
            time.sleep(0.5)
        yield {**env, "PREFECT_API_URL": url, "PREFECT_SERVER_PORT": str(port), "PREFECT_SERVER_PID": str(proc.pid)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


# ---- pipeline processes ------------------------------------------------------------------------
@dataclass
class Run:
    """One pipeline process forked by the zygote."""

    pid: int
    log: Path
    rc_file: Path
    started: float = field(default_factory=time.monotonic)
    killed: bool = False

    def returncode(self) -> int | None:
        if self.rc_file.exists() and self.rc_file.read_text().strip():
            return int(self.rc_file.read_text())
        return None

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> bool:
        """SIGKILL; True if the process was still running its pipeline."""
        if self.returncode() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
            self.killed = True
        while self.alive():  # the zygote reaps it
            time.sleep(0.02)
        return self.killed and self.returncode() is None

    def wait(self, timeout: float = 600) -> int:
        deadline = time.monotonic() + timeout
        while (rc := self.returncode()) is None:
            if not self.alive():
                time.sleep(0.2)
                if (rc := self.returncode()) is None:
                    return -9 if self.killed else -1
                return rc
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"pipeline run {self.pid} took more than {timeout} s; log {self.log}")
            time.sleep(0.1)
        while self.alive():
            time.sleep(0.02)
        return rc

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def published(self) -> set[str]:
        return {m.group(1) for m in _PUBLISHED.finditer(self.output())}

    def reused(self) -> set[str]:
        """Stages that found their artifact: our own check, or Prefect's cache keyed on it."""
        out = self.output()
        return {m.group(1) for m in _REUSED.finditer(out)} | {m.group(1) for m in _CACHED.finditer(out)}

    def publish_times(self) -> dict[str, float]:
        """Seconds of the day at which each stage published (from the log's timestamps)."""
        return {m.group(4): int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
                for m in _TIME.finditer(self.output())}


class Zygote:
    """A process that imported lexiflow once and forks one child per pipeline run."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        # One torch thread per run: several runs share two busy cores, where OpenMP threads spin-wait.
        env = {**env, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.chaos", "zygote"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"zygote did not start: {ready!r}")
        self.count = 0

    def start(self, argv: list[str]) -> Run:
        self.count += 1
        log = self.workdir / f"run-{self.count:03d}.log"
        rc_file = self.workdir / f"run-{self.count:03d}.rc"
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log), "rc": str(rc_file)}) + "\n")
        self.proc.stdin.flush()
        pid = int(self.proc.stdout.readline())
        return Run(pid, log, rc_file)

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def zygote_main() -> None:
    """Read one JSON request per line; fork a child running `flows.cli.main(argv)` for each."""
    prefect_env.apply()
    import lexiflow.flows.cli
    import lexiflow.flows.pipeline  # noqa: F401 (the expensive imports, done once)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 70
            try:
                fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1), os.dup2(fd, 2)
                sys.stdin.close()
                code = lexiflow.flows.cli.main(request["argv"])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush(), sys.stderr.flush()
                tmp = request["rc"] + ".tmp"
                with open(tmp, "w") as f:
                    f.write(str(code))
                os.replace(tmp, request["rc"])  # the return code appears whole or not at all
                os._exit(code)
        print(pid, flush=True)


# ---- store checks ------------------------------------------------------------------------------
def audit(store_root: Path) -> list[str]:
    """Problems a reader could see in a local store: an artifact whose files differ from its
    manifest (sizes and SHA-256), or a visible `<kind>/<version>` folder without a manifest."""
    from lexiflow.storage import ArtifactStore, Catalog

    store = ArtifactStore(str(store_root))
    _checked, problems = Catalog(store).audit(full=True)
    if store_root.exists():
        for folder in store_root.glob("*/*"):
            if not folder.parts[-2].startswith(".") and not (folder / "manifest.json").is_file():
                problems.append(f"{folder}: visible folder without a manifest")
    listed = {(m["kind"], m["version"]) for m in Catalog(store).list()}
    if len(listed) != len(Catalog(store).entries()):
        problems.append("catalog lists an artifact twice")
    return problems


def published(store_root: Path) -> dict[str, set[str]]:
    from lexiflow.storage import Catalog

    out: dict[str, set[str]] = {}
    for kind, version in Catalog(str(store_root)).entries():
        out.setdefault(kind, set()).add(version)
    return out


# ---- the experiments ---------------------------------------------------------------------------
@dataclass
class CrashReport:
    kills_tried: int = 0
    kills_survived: int = 0  # the store audited clean after the kill and later runs reused what was there
    runs_completed: int = 0
    stores: int = 0
    kill_stages: list[str] = field(default_factory=list)  # the stage running when each kill struck
    problems: list[str] = field(default_factory=list)


def crash_loop(zygote: Zygote, workdir: Path, kills: int, seed: int = 0,
               extra_args: list[str] | None = None) -> CrashReport:
    """Kill -9 pipeline runs at random moments until `kills` kills have struck a running pipeline.

    A store lives until a run on it completes (an "episode"): every run after a kill is a rerun of
    the same parameters on the same store. After every kill the store must audit clean; every
    rerun must reuse (never publish again) each stage published before it started, and the rerun
    that ends an episode must complete with every stage present. Each kill first draws the stage to
    strike among those the store lacks, waits until the run has published or reused the stages that
    came before it in a calibration run, then strikes at a moment uniform over 1.1 × that stage's calibrated duration.
    Drawing a stage, not a moment in the run, spreads the kills over the pipeline however fast this
    machine is now and whichever order concurrent stages finish in.
    """
    rng = random.Random(seed)
    report = CrashReport()
    args = [*SMALL_RUN, *(extra_args or [])]

    def new_store() -> Path:
        report.stores += 1
        return workdir / f"store-{report.stores:02d}"

    calibration = zygote.start(["run", "--store", str(new_store()), *args])
    if calibration.wait() != 0:
        raise RuntimeError(f"calibration run failed:\n{calibration.output()[-3000:]}")
    report.runs_completed += 1
    total = time.monotonic() - calibration.started
    times = calibration.publish_times()
    order = sorted(times, key=times.get)  # stages in the order the calibration run published them
    startup = (total - (times[order[-1]] - times[order[0]])) * 0.5  # a guess: half of the rest is start-up
    # Seconds of work before each stage published, on this machine now (the first includes start-up).
    duration = {kind: times[kind] - times[prev] if prev else startup
                for prev, kind in zip([None, *order], order, strict=False)}

    store = new_store()
    while report.kills_tried < kills:
        before = published(store)
        missing = [kind for kind in order if kind not in before]
        run = zygote.start(["run", "--store", str(store), *args])
        target = rng.choice(missing) if missing else None  # none missing: the rerun ends the episode
        needed = set(order[:order.index(target)]) if target else set()
        # A rerun logs each stage it reuses, so this also waits out its start-up and reuse checks.
        while not needed <= run.published() | run.reused() and run.returncode() is None and run.alive():
            time.sleep(0.01)
        delay = rng.uniform(0.0, 1.1 * duration[target]) if target else float("inf")
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and run.returncode() is None and run.alive():
            time.sleep(0.01)
        struck = run.kill()
        rc = run.wait()
        problems = []
        republished = {k for k in run.published() if k in before}
        if republished:
            problems.append(f"run {run.pid} rebuilt finished stages {sorted(republished)}")
        problems += audit(store)
        if struck:
            report.kills_tried += 1
            report.kill_stages.append(f"after {len(set(published(store)))} stages, aimed at {target} +{delay:.1f}s")
            if not problems:
                report.kills_survived += 1
        elif rc == 0:
            report.runs_completed += 1
            problems += published_kinds_missing(store, run)
            store = new_store()  # the episode ended with a complete rerun
        else:
            problems.append(f"run {run.pid} failed with status {rc}:\n{run.output()[-3000:]}")
        report.problems += problems

    # Close the last episode: a rerun without a kill completes and reuses everything there.
    if published(store):
        before = published(store)
        run = zygote.start(["run", "--store", str(store), *args])
        if run.wait() != 0:
            report.problems.append(f"final rerun failed:\n{run.output()[-3000:]}")
        else:
            report.runs_completed += 1
            report.problems += published_kinds_missing(store, run)
            if run.published() & set(before):
                report.problems.append(f"final rerun rebuilt {sorted(run.published() & set(before))}")
    return report


def published_kinds_missing(store: Path, run: Run) -> list[str]:
    """A completed run must have published or reused every stage of the pipeline."""
    seen = run.published() | run.reused()
    kinds = set(published(store))
    if not seen or seen != kinds:
        return [f"completed run {run.pid}: stages seen {sorted(seen)} but store holds {sorted(kinds)}"]
    return []


# A small LSTM, 120 steps (~10-30 s here): long enough for kills to land between its checkpoints (every 10 steps).
NEURAL_RUN = [*SMALL_RUN, "--set", 'lm=["lstm"]', "--set", "neural.emb_dim=32", "--set", "neural.hidden_dim=32",
              "--set", "neural.num_layers=1", "--set", "neural.batch_size=8", "--set", "neural.epochs=1",
              "--set", "neural.max_steps=120",
              "--set", "neural.warmup_steps=5", "--set", "neural.checkpoint_every=10", "--set", "neural.lr=0.005"]
_RESUMED = re.compile(r"resuming from \S+ at step (\d+)")
_TRAINED = re.compile(r"trained (\d+) steps in this process \(steps (\d+)-(\d+) of (\d+)\)")


@dataclass
class NeuralCrashReport:
    kills_tried: int = 0
    kills_survived: int = 0  # the store audited clean and the next run resumed from the checkpoint the kill left
    resumed_at: list[int] = field(default_factory=list)  # the step each rerun resumed from
    steps_trained: list[int] = field(default_factory=list)  # steps each rerun performed (fewer than the total)
    total_steps: int = 0
    max_weight_diff: float = math.nan  # resumed vs uninterrupted final weights, max |difference|
    episodes: int = 1  # stores used: a run that finished before its kill moment starts a new one
    problems: list[str] = field(default_factory=list)


def _checkpoint_step(store: Path) -> int | None:
    """The step of the neural LM checkpoint in the store's scratch space (None: no checkpoint yet)."""
    from lexiflow.models.lm.train import find_checkpoint

    for folder in sorted((store / ".scratch").glob("lm-*")):
        found = find_checkpoint(str(folder))
        if found is not None:
            with contextlib.suppress(OSError, ValueError):  # being swapped in right now: ask again
                return int(json.loads((found / "trainer.json").read_text())["position"]["step"])
    return None


def _lm_weights(store: Path) -> tuple[dict, dict]:
    from lexiflow.storage import ArtifactStore, Catalog
    from safetensors.numpy import load_file

    manifest = Catalog(str(store)).latest("lm")
    path = Path(ArtifactStore(str(store)).path("lm", manifest["version"]))
    return manifest, load_file(str(path / "model.safetensors"))


def neural_crash_loop(zygote: Zygote, workdir: Path, kills: int, seed: int = 0) -> NeuralCrashReport:
    """Kill -9 pipeline runs while the neural LM trains, each time after its run wrote at least one new
    checkpoint, at a random moment within about two checkpoint intervals; then rerun until one completes.

    Checked: after every kill the store audits clean; every rerun logs that it resumed at the step of
    the checkpoint on disk and trains only the remaining steps; the final `lm` artifact verifies and its
    weights and perplexities equal those of an uninterrupted run on a fresh store (same version).
    """
    rng = random.Random(seed)
    report = NeuralCrashReport()
    reference_store, store = workdir / "uninterrupted", workdir / "killed"
    reference = zygote.start(["run", "--store", str(reference_store), *NEURAL_RUN])
    if reference.wait() != 0:
        raise RuntimeError(f"uninterrupted neural run failed:\n{reference.output()[-3000:]}")
    trained = _TRAINED.search(reference.output())
    if trained is None:
        raise RuntimeError(f"no training summary in the uninterrupted run's log:\n{reference.output()[-3000:]}")
    report.total_steps = int(trained.group(4))
    # Warm the upstream stages (reused by every later run), so kills land in training, not before it.
    warm = zygote.start(["run", "--store", str(store), *SMALL_RUN])
    if warm.wait() != 0:
        raise RuntimeError(f"upstream run failed:\n{warm.output()[-3000:]}")

    expected_resume: int | None = None
    last_kill_clean = False
    while True:
        run = zygote.start(["run", "--store", str(store), *NEURAL_RUN])
        struck = False
        if report.kills_tried < kills:
            # Wait for a checkpoint newer than the one this run resumed from, then a random moment.
            start_step = expected_resume or 0
            while run.returncode() is None and run.alive() and (_checkpoint_step(store) or 0) <= start_step:
                time.sleep(0.01)
            started = time.monotonic()
            while run.returncode() is None and run.alive() and (_checkpoint_step(store) or 0) <= start_step + 10:
                time.sleep(0.01)  # one more checkpoint: the time between two checkpoints on this machine now
            interval = time.monotonic() - started
            deadline = time.monotonic() + rng.uniform(0.0, 2.0 * interval)
            while time.monotonic() < deadline and run.returncode() is None and run.alive():
                time.sleep(0.01)
            struck = run.kill()
        rc = run.wait()
        output = run.output()
        if expected_resume is not None:  # the run after a kill
            resumed = _RESUMED.search(output)
            if resumed is None or int(resumed.group(1)) != expected_resume:
                report.problems.append(f"run {run.pid} did not resume at step {expected_resume}: "
                                       f"{resumed.group(0) if resumed else 'no resume line'}")
            else:
                report.resumed_at.append(expected_resume)
                report.kills_survived += last_kill_clean
            done = _TRAINED.search(output)
            if done is not None:
                report.steps_trained.append(int(done.group(1)))
                if int(done.group(1)) != report.total_steps - expected_resume:
                    report.problems.append(f"run {run.pid} trained {done.group(1)} steps after resuming at "
                                           f"{expected_resume} of {report.total_steps}")
        if struck:
            report.kills_tried += 1
            kill_problems = audit(store)
            expected_resume = _checkpoint_step(store)
            if expected_resume is None:
                kill_problems.append("the kill left no checkpoint")
            last_kill_clean = not kill_problems
            report.problems += kill_problems
            continue
        if rc != 0:
            report.problems.append(f"run {run.pid} failed with status {rc}:\n{output[-3000:]}")
        elif report.kills_tried < kills:  # finished before the kill struck: the next kills go to a new store
            report.episodes += 1
            store = workdir / f"killed-{report.episodes}"
            if zygote.start(["run", "--store", str(store), *SMALL_RUN]).wait() != 0:
                raise RuntimeError("upstream run failed")
            expected_resume = None
            continue
        break
    report.problems += audit(store)
    from lexiflow.storage import ArtifactStore
    from lexiflow.storage.manifests import metric_number

    (ours, weights), (theirs, reference_weights) = _lm_weights(store), _lm_weights(reference_store)
    report.problems += ArtifactStore(str(store)).verify("lm", ours["version"], full=True)
    if ours["version"] != theirs["version"]:
        report.problems.append(f"resumed lm {ours['version']} differs from the uninterrupted {theirs['version']}")
    report.max_weight_diff = max(float(abs(weights[k] - reference_weights[k]).max()) for k in reference_weights)
    for key in ("valid_perplexity", "test_perplexity"):
        a, b = (metric_number(m["metrics"][key]) for m in (ours, theirs))  # "Infinity": a diverged run
        if not math.isclose(a, b, rel_tol=1e-4):
            report.problems.append(f"{key}: resumed {a} vs uninterrupted {b}")
    return report


@dataclass
class ConcurrencyReport:
    started: int = 0
    completed: int = 0
    problems: list[str] = field(default_factory=list)


def concurrent_runs(zygote: Zygote, store: Path, variants: list[list[str]], timeout: float = 600
                    ) -> ConcurrencyReport:
    """Start one run per variant at once on one store; all must complete, the store must audit
    clean, and each run's reported artifacts must be exactly the catalog's (no duplicates)."""
    report = ConcurrencyReport()
    runs = [zygote.start(["run", "--store", str(store), *SMALL_RUN, *variant]) for variant in variants]
    report.started = len(runs)
    refs: set[tuple[str, str]] = set()
    for run in runs:
        rc = run.wait(timeout)
        if rc != 0:
            report.problems.append(f"run {run.pid} exited {rc}:\n{run.output()[-3000:]}")
            continue
        report.completed += 1
        refs |= {(m.group(1), m.group(2)) for m in re.finditer(r"/(\w+)/([0-9a-f]{16})$", run.output(), re.M)}
    report.problems += audit(store)
    from lexiflow.storage import Catalog

    entries = Catalog(str(store)).entries()
    if sorted(set(entries)) != sorted(entries) or set(entries) != refs:
        report.problems.append(f"catalog {sorted(entries)} differs from what the runs reported {sorted(refs)}")
    return report


def temp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


if __name__ == "__main__":
    if sys.argv[1:] == ["zygote"]:
        zygote_main()
    else:
        sys.exit("usage: python -m benchmarks.chaos zygote")
