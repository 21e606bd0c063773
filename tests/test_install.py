"""The install: the locks agree with pyproject.toml, `make` refuses a too-old Python, and the `lexiflow` command
refuses an environment that no longer matches the checkout's lock."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from lexiflow import install_check
from lexiflow.flows.cli import command
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).parents[1]
LOCKS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# What each lock installs: `make run` the runtime, `make test` the dev and bench extras with it.
EXTRAS = {"runtime.txt": (), "dev.txt": ("dev", "bench")}
ROOT_ANNOTATION = "lexiflow (pyproject.toml)"  # the locks' "via" for a requirement pyproject states


def requirements(project: dict, extras: tuple[str, ...]) -> list[Requirement]:
    return [Requirement(line) for line in
            [*project["dependencies"], *(x for extra in extras for x in project["optional-dependencies"][extra])]]


def lock_entries(text: str) -> dict[str, tuple[str, set[str]]]:
    """Package → (version, the packages or files the lock says it is there for: its `# via` lines)."""
    entries: dict[str, tuple[str, set[str]]] = {}
    name = None
    for line in text.splitlines():
        pinned = re.match(r"([A-Za-z0-9][\w.-]*)==([^\s\\]+)", line)
        if pinned:
            name = install_check.normalized(pinned[1])
            entries[name] = (pinned[2], set())
        elif name and (via := re.match(r"\s*#\s+(?:via\s*)?(\S.*)?$", line)) and via[1]:
            entries[name][1].add(via[1].strip())
        elif not line.strip() or not line.startswith(" "):
            name = None
    return entries


def lock_problems(project: dict, extras: tuple[str, ...], lock_text: str, torch_pin: str) -> list[str]:
    """How a lock disagrees with pyproject: a requirement missing or at a version it excludes, or a package that
    no requirement needs (reached from pyproject's requirements through the `via` annotations)."""
    entries = lock_entries(lock_text)
    versions = {name: version for name, (version, _) in entries.items()} | {"torch": torch_pin.partition("==")[2]}
    wanted = requirements(project, extras)
    problems = []
    for req in wanted:
        version = versions.get(install_check.normalized(req.name))
        if version is None:
            problems.append(f"{req} is not in the lock")
        elif not req.specifier.contains(Version(version), prereleases=True):
            problems.append(f"{req}: the lock has {version}")
    needed = {install_check.normalized(req.name) for req in wanted}
    dropped = [name for name, (_, via) in entries.items() if ROOT_ANNOTATION in via and name not in needed]
    problems += [f"{name} is locked for pyproject, which no longer requires it" for name in dropped]
    grew = True
    while grew:  # add the packages that the needed ones depend on
        reached = {name for name, (_, via) in entries.items() if name not in needed and via & needed}
        needed |= reached
        grew = bool(reached)
    problems += [f"{name} is locked but nothing pyproject requires needs it"
                 for name in entries if name not in needed and name not in dropped]
    return problems


def read(lock: str) -> str:
    return (LOCKS / lock).read_text(encoding="utf-8")


TORCH_PIN = next(line for line in read("torch.txt").splitlines() if line.startswith("torch=="))


@pytest.mark.parametrize("lock", sorted(EXTRAS))
def test_each_lock_holds_exactly_what_pyproject_requires(lock):
    assert lock_problems(PYPROJECT, EXTRAS[lock], read(lock), TORCH_PIN) == [], "run `make lock`"


def test_make_run_and_make_test_install_the_same_version_of_each_runtime_package():
    runtime, dev = (install_check.locked_versions(LOCKS / lock) for lock in ("runtime.txt", "dev.txt"))
    assert {name: dev.get(name) for name in runtime} == runtime
    assert "pytest" in dev and "pytest" not in runtime and "moto" not in runtime


# torch's requirements, from the METADATA of the CPU wheel this machine installs and of the CUDA build seen on
# a GPU machine (PyPI's torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl), less the CUDA packages that build
# brings along and the optional extras.
TORCH_REQUIRES = {
    "2.13.0+cpu": ["filelock", "typing-extensions>=4.10.0", "setuptools>=77.0.3", "sympy>=1.13.3",
                   "networkx>=2.5.1", "jinja2", "fsspec>=0.8.5"],
    "2.11.0": ["filelock", "typing-extensions>=4.10.0", "setuptools<82", "sympy>=1.13.3", "networkx>=2.5.1",
                     "jinja2", "fsspec>=0.8.5"],
}


@pytest.mark.parametrize("build", sorted(TORCH_REQUIRES))
def test_torch_stays_out_of_the_hashed_locks_and_both_builds_accept_what_they_lock(build):
    (torch,) = (Requirement(x) for x in PYPROJECT["dependencies"] if x.startswith("torch"))
    assert torch.specifier.contains(build)
    for lock in EXTRAS:
        locked = install_check.locked_versions(LOCKS / lock)
        assert "torch" not in locked
        for requirement in map(Requirement, TORCH_REQUIRES[build]):
            assert requirement.specifier.contains(locked[requirement.name], prereleases=True), (lock, requirement)


def edited(change) -> dict:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    change(project)
    return project


def test_the_lock_check_fails_when_pyproject_changes_without_a_new_lock():
    runtime = read("runtime.txt")

    def bump_polars(p):
        p["dependencies"] = [("polars>=99" if x.startswith("polars") else x) for x in p["dependencies"]]

    def drop_gensim(p):
        p["dependencies"] = [x for x in p["dependencies"] if not x.startswith("gensim")]

    assert lock_problems(edited(bump_polars), (), runtime, TORCH_PIN) == [
        f"polars>=99: the lock has {install_check.locked_versions(LOCKS / 'runtime.txt')['polars']}"]
    assert lock_problems(edited(lambda p: p["dependencies"].append("duckdb>=1.0")), (), runtime, TORCH_PIN) == [
        "duckdb>=1.0 is not in the lock"]
    # gensim gone: gensim itself, and smart-open and wrapt, which only gensim needs, are left over
    assert sorted(lock_problems(edited(drop_gensim), (), runtime, TORCH_PIN)) == [
        "gensim is locked for pyproject, which no longer requires it",
        "smart-open is locked but nothing pyproject requires needs it",
        "wrapt is locked but nothing pyproject requires needs it"]
    assert lock_problems(PYPROJECT, (), runtime, "torch==2.1.0") == ["torch>=2.2: the lock has 2.1.0"]


def fake_python(tmp_path: Path, version: tuple[int, int]) -> Path:
    """This interpreter, reporting another version (sitecustomize runs before any `-c` code)."""
    site = tmp_path / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(f"import sys\nsys.version_info = {(*version, 0, 'final', 0)!r}\n")
    python = tmp_path / "python3"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


def test_make_refuses_a_python_older_than_pyproject_requires_before_creating_the_venv(tmp_path):
    venv = tmp_path / "venv"
    result = make("install", f"PYTHON={fake_python(tmp_path, (3, 10))}", f"VENV={venv}")
    assert result.returncode != 0
    error = result.stderr.splitlines()[0]
    assert re.fullmatch(r"error: lexiflow needs Python 3\.11\+ and \S+/python3 is 3\.10: "
                        r"run make with PYTHON=python3\.11", error), result.stderr
    assert not venv.exists()
    assert make("python-version", f"PYTHON={fake_python(tmp_path / 'new', (3, 11))}",
                f"VENV={venv}").returncode == 0


def test_make_installs_again_once_the_lock_is_newer_than_the_venv(tmp_path):
    stamp, uv = tmp_path / ".installed-runtime", tmp_path / "bin" / "uv"
    uv.parent.mkdir()
    for done in stamp, uv:
        done.touch()
        newer = (LOCKS / "runtime.txt").stat().st_mtime + 3600
        os.utime(done, (newer, newer))
    assert "install" not in make("-n", "install", f"VENV={tmp_path}").stdout.replace("python-version", "")
    os.utime(stamp, (0, 0))  # installed before the lock (and pyproject.toml) last changed: a `git pull` since
    plan = make("-n", "install", f"VENV={tmp_path}").stdout
    assert f"{uv} pip install -q --python {tmp_path}/bin/python --no-deps --require-hashes -r " \
           f"{Path('requirements', 'runtime.txt')}" in plan
    assert f"{tmp_path} was installed before requirements/runtime.txt " in plan
    assert "uv.txt" not in plan  # the installer is as new as its lock: not installed again


def test_the_installer_is_locked_with_hashes_and_installed_before_anything_else(tmp_path):
    lock = read("uv.txt")
    assert list(install_check.locked_versions(LOCKS / "uv.txt")) == ["uv"]
    assert lock.count("--hash=sha256:") >= 2  # a wheel for each platform
    plan = make("-n", "install", f"VENV={tmp_path / 'venv'}").stdout.splitlines()
    (first,) = [i for i, line in enumerate(plan) if "-r requirements/uv.txt" in line]
    assert "--require-hashes" in plan[first]
    assert all("uv pip" not in line for line in plan[:first])


def site_packages(folder: Path, *installed: str) -> list[str]:
    for dist in installed:
        (folder / f"{dist}.dist-info").mkdir(parents=True)
    return [str(folder), str(folder / "not-there")]


def test_stale_install_names_the_first_difference_from_the_lock(tmp_path):
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "runtime.txt").write_text(
        "polars==2.1.0 \\\n    --hash=sha256:00\n    # via lexiflow (pyproject.toml)\n"
        "typing-extensions==4.16.0 \\\n    --hash=sha256:11\n")
    first = site_packages(tmp_path / "a", "polars-2.1.0", "typing_extensions-4.16.0")
    assert install_check.stale_install(tmp_path, first) is None
    # the first entry of the path that holds a package is the one imported
    assert install_check.stale_install(tmp_path, [*first, *site_packages(tmp_path / "b", "polars-2.0.0")]) is None
    problem = install_check.stale_install(tmp_path, site_packages(tmp_path / "c", "polars-2.0.0"))
    assert problem.startswith(f"this environment ({sys.prefix}) does not match requirements/runtime.txt "
                              "(polars 2.0.0 installed, 2.1.0 locked and 1 more)")
    assert problem.endswith(f"run `make install` in {tmp_path}") and "\n" not in problem
    assert "(typing-extensions 4.16.0 not installed)" in install_check.stale_install(
        tmp_path, site_packages(tmp_path / "d", "polars-2.1.0"))
    assert install_check.stale_install(tmp_path / "c", first) is None  # a wheel install: no lock beside it


def test_the_command_stops_in_one_line_when_the_checkout_lock_changed(tmp_path, monkeypatch, capsys):
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "runtime.txt").write_text("numpy==0.0.1\n")  # no numpy is 0.0.1
    monkeypatch.setattr(install_check, "CHECKOUT", tmp_path)
    assert command() == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: this environment (") and "numpy" in line and "0.0.1 locked" in line
