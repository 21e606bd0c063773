"""A run with nothing to do costs only what it must (issue 61): `lexiflow --help` imports nothing heavy, and a
`lexiflow run` on a fully cached store imports no torch (what it imports, not a timing: `python -m benchmarks noop`
times both beside the cold run)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "prefect", "pydantic", "polars", "numpy")
REPORT = textwrap.dedent("""
    import json, sys
    from lexiflow.flows.cli import main
    try:
        status = main(sys.argv[1:])
    except SystemExit as exc:
        status = exc.code
    print(json.dumps({"status": status, "imported": sorted({m.split(".")[0] for m in sys.modules})}))
""")


def imported(tmp_path, *argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", REPORT, *argv], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PREFECT_HOME": str(tmp_path / "prefect")})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_help_imports_nothing_heavy(tmp_path):
    found = imported(tmp_path, "--help")
    assert found["status"] == 0 and not set(HEAVY) & set(found["imported"])


@pytest.mark.prefect
@pytest.mark.slow
def test_a_run_on_a_fully_cached_store_imports_no_torch(tmp_path):
    argv = ["run", "--store", str(tmp_path / "store"), "--corpus", "builtin:lee", "--set", "svd.dim=20",
            "--set", 'embeddings=["svd"]', "--set", "lm=[]"]
    assert imported(tmp_path, *argv)["status"] == 0  # cold: builds everything
    cached = imported(tmp_path, *argv)
    assert cached["status"] == 0 and "torch" not in cached["imported"]
