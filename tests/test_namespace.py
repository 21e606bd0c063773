"""lexiflow installs one top-level package: folders named like its subpackages elsewhere on
sys.path (a Dask worker's `storage/` spill folder in its working directory) cannot shadow it."""

import subprocess
import sys


def test_lexiflow_imports_from_a_directory_holding_folders_named_like_its_subpackages(tmp_path):
    for name in ("models", "storage", "tasks", "flows", "deployments"):
        (tmp_path / name).mkdir()  # namespace-package candidates, as Dask's spill folder is
    (tmp_path / "storage" / "__init__.py").write_text("raise ImportError('the wrong storage package')\n")
    code = ("import sys; sys.path.insert(0, '.'); "
            "from lexiflow.storage import ArtifactWriter; from lexiflow.flows.pipeline import pipeline; "
            "import lexiflow.storage as s; print(s.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert str(tmp_path) not in out.stdout


def test_no_global_subpackage_names_are_installed(tmp_path):
    code = "import importlib.util as u; print([n for n in ('models', 'storage', 'tasks', 'flows') if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
