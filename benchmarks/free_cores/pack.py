"""Packs what `run.sh` needs on a machine with free cores but no package registry (a lent GPU machine:
Python 3.12, torch, numpy, scipy, pyarrow already there) into `.devkit/` at the repository's root:

- `site.tar.xz`: the runtime closure of prefect, polars, dask and distributed as this virtual environment
  has it, as Python 3.12 x86-64 wheels from the registry, unpacked (Prefect's UI and the packages' tests
  left out, to stay under the 64 MiB a call carries);
- `pool.txt.xz`: the benchmark's real line pool (`benchmarks.scaling.save_pool`), since ../shared is not there;
- `gensim/`: a stand-in for gensim's imports (`gensim_standin.py`): the sharded stages never call it.

    .venv/bin/python -m benchmarks.free_cores.pack      # then carry .devkit, run: bash benchmarks/free_cores/run.sh
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOTS = ("prefect", "polars", "dask", "distributed", "psutil", "fsspec", "certifi")
ON_THE_MACHINE = {"numpy", "pyarrow", "scipy", "torch", "pip", "setuptools"}  # large, and there already
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
TARGET = ("--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
          *(flag for platform in PLATFORMS for flag in ("--platform", platform)))
LEFT_OUT = ("prefect/server/ui", "prefect/server/ui-v2")  # the test harness's server runs without its UI
KIT = Path(__file__).resolve().parents[2] / ".devkit"


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)).lower()


def closure(roots: tuple[str, ...] = ROOTS) -> list[str]:
    """`name==version` of every installed distribution the roots need on CPython 3.12, Linux."""
    seen: set[str] = set()
    stack = list(roots)
    environment = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                   "platform_system": "Linux", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython", "extra": ""}
    from packaging.requirements import Requirement

    while stack:
        name = _name(stack.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                stack.append(requirement.name)
    found = []
    for name in sorted(seen - ON_THE_MACHINE):
        try:
            found.append(f"{metadata.metadata(name)['Name']}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            print(f"not installed here, so not packed: {name}", file=sys.stderr)
    return found


def main() -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    KIT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        subprocess.run([*pip, "download", "--no-deps", *TARGET, "-d", wheels, *closure()], check=True)
        subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", site, *TARGET,
                        *sorted(wheels.glob("*.whl"))], check=True)
        for path in [*(site / p for p in LEFT_OUT), *site.rglob("tests"), *site.rglob("__pycache__")]:
            shutil.rmtree(path, ignore_errors=True)
        (site / "gensim").mkdir()
        shutil.copy(Path(__file__).with_name("gensim_standin.py"), site / "gensim" / "__init__.py")
        subprocess.run(f"tar -C {site} -cf - . | xz -9 -T0 > {KIT / 'site.tar.xz'}", shell=True, check=True)
        from benchmarks.scaling import save_pool

        save_pool(str(Path(tmp) / "pool.txt"))
        subprocess.run(f"xz -9 -c {Path(tmp) / 'pool.txt'} > {KIT / 'pool.txt.xz'}", shell=True, check=True)
    print(*(f"{p.name}: {p.stat().st_size / 2**20:.1f} MiB" for p in sorted(KIT.iterdir())), sep="\n")


if __name__ == "__main__":
    main()
