"""docs/design.md's recipe for adding a model, a stage and a parameter, followed once: a toy model, its
parameter section and stage are added to a copy of the package, editing only the files the recipe names, and
`lexiflow run` on a tiny corpus writes its artifact, versioned by its parameter and reused by the next run."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.prefect, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("lexiflow", "models", "storage", "tasks", "flows", "deployments")  # setup.py: all under `lexiflow`

TOY_MODEL = '''"""A toy model: the mean word length of a corpus, times a scale."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field


@dataclass
class ToyConfig:
    scale: Annotated[int, Field(ge=1, description="What the mean word length is multiplied by.")] = 2


class WordLengths:
    def __init__(self, config: ToyConfig) -> None:
        self.config, self.mean = config, 0.0

    def fit(self, texts: list[str]) -> WordLengths:
        words = [word for text in texts for word in text.split()]
        self.mean = self.config.scale * sum(map(len, words)) / max(len(words), 1)
        return self

    def save(self, folder: Path) -> None:
        (Path(folder) / "toy.json").write_text(json.dumps({"scale": self.config.scale, "mean": self.mean}))

    @classmethod
    def load(cls, folder: Path) -> WordLengths:
        saved = json.loads((Path(folder) / "toy.json").read_text())
        model = cls(ToyConfig(scale=saved["scale"]))
        model.mean = saved["mean"]
        return model
'''

TOY_STAGE = '''"""The `toy` stage: a `WordLengths` model of the corpus."""

from __future__ import annotations

from lexiflow.models.config import from_section
from lexiflow.models.toy import ToyConfig, WordLengths
from lexiflow.storage import ArtifactRef, ArtifactStore, ArtifactWriter
from lexiflow.tasks.params import ToyParams
from lexiflow.tasks.stage import stage


@stage("toy")
def build_toy(out: ArtifactWriter, corpus: ArtifactRef, params: ToyParams) -> None:
    documents = ArtifactStore(corpus.store).read_parquet(corpus.kind, corpus.version, "documents.parquet")
    model = WordLengths(from_section(ToyConfig, params)).fit(documents["text"].to_list())
    model.save(out.folder)
    out.metrics["mean_length"] = model.mean
'''


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of `old` in the file at `path` with `new`."""
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


LOAD_TOY = '''def load_toy(store: ArtifactStore, manifest: dict[str, Any]):
    from lexiflow.models.toy import WordLengths

    with local_folder(store, manifest) as folder:
        return WordLengths.load(folder)


'''


def follow_the_recipe(package: Path) -> None:
    """The recipe's steps (docs/design.md, "Adding a model, a stage or a parameter"), as a person would take them."""
    # 1. The model: one file in models/, its configuration a dataclass with annotated fields.
    (package / "models" / "toy.py").write_text(TOY_MODEL)
    # 2. The parameters: a section in tasks/params.py, one line in PipelineParams (flows/params.py).
    params = package / "tasks" / "params.py"
    params.write_text(params.read_text() + '\nfrom lexiflow.models.toy import ToyConfig  # noqa: E402\n\n'
                                           'ToyParams = section("ToyParams", ToyConfig)\n')
    edit(package / "flows" / "params.py", "    TokenizerParams,\n", "    TokenizerParams,\n    ToyParams,\n")
    edit(package / "flows" / "params.py", "    corpus: CorpusParams = Field(",
         '    toy: ToyParams = Field(ToyParams(), description="The toy stage.")\n    corpus: CorpusParams = Field(')
    # 3. The stage: a builder decorated with @stage("toy") in tasks/.
    (package / "tasks" / "toy.py").write_text(TOY_STAGE)
    # 4. One call in flows/pipeline.py, its reference among those the flow returns; the loader; what builds one.
    pipeline = package / "flows" / "pipeline.py"
    edit(pipeline, "from lexiflow.tasks.translation import", "from lexiflow.tasks.toy import build_toy\n"
                                                            "from lexiflow.tasks.translation import")
    edit(pipeline, "    words = learn_vocabulary(", "    toy = build_toy(store, corpus=docs, params=p.toy)\n"
                                                  "    words = learn_vocabulary(")
    edit(pipeline, '    refs = {"corpus": docs,', '    refs = {"toy": toy, "corpus": docs,')
    loaders = package / "loaders.py"  # lexiflow/loaders.py
    table = "LOADERS: dict[str, Loader] = {\n"
    edit(loaders, table, f'{LOAD_TOY}{table}    "toy": load_toy,\n')
    corpus_row = '    "corpus": ("", ""),\n'
    edit(package / "storage" / "built_by.py", corpus_row, f'{corpus_row}    "toy": ("", ""),\n')


def recipe_files() -> set[str]:
    """The files docs/design.md's recipe names, as paths in the repository."""
    design = (ROOT / "docs" / "design.md").read_text()
    recipe = design.split("### Adding a model, a stage or a parameter", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`((?:models|tasks|flows|storage|lexiflow)/[a-z_/]+\.py)`", recipe))


def changed_files(package: Path) -> tuple[set[str], set[str]]:
    """(files edited, files added) in the copy of the package, as paths in the repository."""
    edited, added = set(), set()
    for path in package.rglob("*.py"):
        name = path.relative_to(package).as_posix()
        name = name if name.split("/")[0] in FOLDERS else f"lexiflow/{name}"  # lexiflow/ is the package's own
        original = ROOT / name
        if not original.exists():
            added.add(name)
        elif not filecmp.cmp(path, original, shallow=False):
            edited.add(name)
    return edited, added


@pytest.fixture(scope="module")
def prefect_api_url():
    """One Prefect server for the runs below (each `lexiflow run` would start its own)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):
        yield PREFECT_API_URL.value()


def lexiflow(package: Path, cwd: Path, *args: str, api_url: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(package), "PREFECT_HOME": str(cwd / "prefect")}
    env.pop("PREFECT_API_URL", None)
    env.update({"PREFECT_API_URL": api_url} if api_url else {})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def toy_manifests(store: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((store / "toy").glob("*/manifest.json"))]


def test_the_recipe_adds_a_stage_touching_only_the_files_it_names(tmp_path, prefect_api_url):
    package = tmp_path / "package"
    for folder in FOLDERS:  # the installed layout: every folder under `lexiflow`
        target = package / "lexiflow" if folder == "lexiflow" else package / "lexiflow" / folder
        shutil.copytree(ROOT / folder, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    follow_the_recipe(package / "lexiflow")

    edited, added = changed_files(package / "lexiflow")
    assert added == {"models/toy.py", "tasks/toy.py"}
    assert edited <= recipe_files(), f"the recipe (docs/design.md) does not name {sorted(edited - recipe_files())}"

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(f"The cat number {i} sat on the mat. A dog {i % 7} barked." for i in range(200)))
    store = tmp_path / "store"
    run = ["-m", "lexiflow.flows.cli", "run", "--store", str(store), "--corpus", str(corpus),
           "--set", "vocabulary.min_count=1", "--set", "svd.dim=5", "--set", 'embeddings=["svd"]', "--set", "lm=[]",
           "--set", "evaluation.analogy_vocabulary=100", "--set", "evaluation.projection_words=0"]
    where = lexiflow(package, tmp_path, "-c", "import lexiflow.models.toy as m; print(m.__file__)")
    assert where.stdout.strip().startswith(str(package)), where.stderr  # the copy runs, not the checkout

    first = lexiflow(package, tmp_path, *run, api_url=prefect_api_url)
    assert first.returncode == 0, first.stderr[-3000:]
    assert re.search(r"^  toy +[0-9a-f]{16} ", first.stdout, re.MULTILINE), first.stdout
    [toy] = toy_manifests(store)
    assert toy["parameters"]["params"]["scale"] == 2 and set(toy["inputs"]) == {"corpus"}
    assert toy["code_version"] and [f["name"] for f in toy["files"]] == ["toy.json"]

    again = lexiflow(package, tmp_path, *run, api_url=prefect_api_url)  # cached: the same version, not written again
    assert again.returncode == 0, again.stderr[-3000:]
    [reused] = toy_manifests(store)
    assert reused == toy

    # its parameter: a new version
    scaled = lexiflow(package, tmp_path, *run, "--set", "toy.scale=3", api_url=prefect_api_url)
    assert scaled.returncode == 0, scaled.stderr[-3000:]
    versions = {m["version"]: m for m in toy_manifests(store)}
    assert len(versions) == 2 and {m["parameters"]["params"]["scale"] for m in versions.values()} == {2, 3}
    new = next(m for m in versions.values() if m["parameters"]["params"]["scale"] == 3)
    assert new["metrics"]["mean_length"] == pytest.approx(toy["metrics"]["mean_length"] * 3 / 2)

    # The loader gives the model; the stage's code version covers the model's module, derived, not declared.
    loaded = lexiflow(package, tmp_path, "-c", "import sys; from lexiflow.loaders import load; "
                      "from lexiflow.tasks.toy import build_toy; print(load(sys.argv[1], 'toy', sys.argv[2]).mean); "
                      "print(build_toy.code_modules({}))", str(store), new["version"])
    mean, modules = loaded.stdout.splitlines()
    assert float(mean) == pytest.approx(new["metrics"]["mean_length"]), loaded.stderr
    assert "lexiflow.models.toy" in modules and "lexiflow.tasks.toy" in modules
