"""One configuration for every entry point (issue 61): the TOML/JSON `--config` file and `--set` that `lexiflow run`
takes also configure the `pipeline` and `corpus-rebuild` deployments (`lexiflow serve`, `python -m
deployments.definitions`), and serve-release exports beside the store, never into the checkout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lexiflow.deployments import serve
from lexiflow.deployments.definitions import DEPLOYMENTS, DeployConfig

ROOT = Path(__file__).resolve().parents[1]
# What a rebuild on builtin:lee needs to release (the first build's floors, lowered; tests/test_release_gate.py).
CONFIG = """
embeddings = ["svd"]
lm = []

[svd]
dim = 20

[corpus]
sources = ["builtin:lee"]

[checks]
similarity_floor_z = 2
advisory = ["evaluation.simlex999_spearman"]
"""


def parameters(name: str, config: DeployConfig) -> dict:
    return next(spec for spec in DEPLOYMENTS if spec.name == name).parameters(config)


@pytest.fixture
def started(monkeypatch):
    """`lexiflow serve`'s configurations, with nothing started."""
    configs = []

    def start(home, config, **_options):
        configs.append(config)
        return {"ui_url": "u", "api_url": "a", "deployments": {}, "processes": []}

    monkeypatch.setattr(serve, "start", start)
    return configs


def test_serve_bakes_the_config_file_and_set_into_pipeline_and_corpus_rebuild(tmp_path, monkeypatch, started, capsys):
    from lexiflow.flows.cli import build_parser, main
    from lexiflow.flows.commands.run import params_tree

    (tmp_path / "rebuild.toml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    options = ["--config", "rebuild.toml", "--set", "svd.dim=30", "--set", "checks.coverage_floor=0.7"]
    assert main(["serve", "--home", "h", "--store", "store", *options]) == 0
    config, = started
    assert config.store == f"{tmp_path}/store"
    assert config.sources == ["builtin:lee"]  # corpus-rebuild's sources: the file's, as --corpus would give them
    assert config.serving == f"{tmp_path}/serving"  # beside the store, not in the checkout
    assert "serve-release exports to: " + config.serving in capsys.readouterr().out
    # the tree `lexiflow run` reads from the same options, the deployments' store and training added
    tree = params_tree(build_parser().parse_args(["run", *options]))
    assert tree["svd"] == {"dim": 30} and tree["checks"]["coverage_floor"] == 0.7
    pipeline = parameters("pipeline", config)
    assert pipeline == {**tree, "store": config.store, "training": {"remote": True}}
    rebuild = parameters("corpus-rebuild", config)
    assert rebuild == {**pipeline, "release": {"when": "always", "alias": "production"},
                       "parallel": {"pieces": True}}  # corpus-rebuild's default, under the configured parameters
    # --corpus still names corpus-rebuild's sources, over the file's; a set value wins over serve's defaults
    assert main(["serve", "--home", "h", "--config", "rebuild.toml", "--corpus", "data/*.txt",
                 "--set", "training.remote=false"]) == 0
    assert started[1].sources == [f"{tmp_path}/data/*.txt"]
    assert parameters("corpus-rebuild", started[1])["corpus"] == {"sources": [f"{tmp_path}/data/*.txt"]}
    assert parameters("pipeline", started[1])["training"] == {"remote": False}


def test_serving_is_never_in_the_checkout():
    assert DeployConfig(store="/data/lexiflow/artifacts").serving == "/data/lexiflow/serving"
    assert not DeployConfig(store="s3://bucket/lexiflow").serving.startswith(str(ROOT / "serving"))
    assert DeployConfig(store="s3://bucket/lexiflow", serving="/srv/x").serving == "/srv/x"


@pytest.mark.parametrize("argv, message", [
    (["--set", "svd.dim=1"], "error: pipeline: invalid pipeline parameters: svd.dim: Input should be greater than "
                             "or equal to 2"),
    (["--set", "bogus.x=1"], "error: pipeline: invalid pipeline parameters: bogus: Extra inputs are not permitted"),
    (["--set", "svd"], "error: --set 'svd': expected key=value"),
])
def test_serve_refuses_a_bad_parameter_in_one_line_before_starting_anything(tmp_path, capsys, monkeypatch, argv,
                                                                            message):
    from lexiflow.flows.cli import main

    monkeypatch.setattr(serve, "_spawn", lambda *a, **k: pytest.fail("serve started a process"))
    assert main(["serve", "--home", str(tmp_path / "home"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "home").exists()


@pytest.mark.prefect
@pytest.mark.slow
def test_a_deploy_with_a_config_file_is_read_back_from_a_real_server_and_a_redeploy_applies_it_again(tmp_path):
    """`python -m deployments.definitions --config FILE --set k=v` against a real `prefect server`: the deployments'
    parameters as the server holds them; a UI edit of them is replaced by the next deploy, a pause is kept."""
    import httpx
    from lexiflow.deployments import definitions
    from lexiflow.flows.prefect_env import environment
    from lexiflow.flows.server import free_port
    from prefect.settings import PREFECT_API_URL, temporary_settings

    (tmp_path / "rebuild.toml").write_text(CONFIG)
    home, port = tmp_path / "home", free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    server, popen = serve._spawn("server", [*serve._prefect(), "server", "start", "--host", "127.0.0.1",
                                            "--port", str(port)], environment(home, api_url), home)
    argv = ["--store", str(tmp_path / "store"), "--config", str(tmp_path / "rebuild.toml"), "--set",
            "checks.coverage_floor=0.7", "--only", "pipeline", "corpus-rebuild", "--cron", "*/5 * * * *"]
    try:
        serve.wait_healthy(api_url, 180, popen)
        api = httpx.Client(base_url=api_url, timeout=60)
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            assert definitions.main(argv) == 0

            def read(name: str) -> dict:
                return api.get(f"/deployments/name/pipeline/{name}").json()

            rebuild = read("corpus-rebuild")
            assert rebuild["parameters"]["checks"] == {"similarity_floor_z": 2, "coverage_floor": 0.7,
                                                       "advisory": ["evaluation.simlex999_spearman"]}
            assert rebuild["parameters"]["corpus"] == {"sources": ["builtin:lee"]}
            assert rebuild["parameters"]["release"] == {"when": "always", "alias": "production"}
            assert [s["schedule"]["cron"] for s in rebuild["schedules"]] == ["*/5 * * * *"]
            assert read("pipeline")["parameters"]["svd"] == {"dim": 20}
            # an edit in the UI (Edit deployment: parameters), a pause; then a redeploy
            edit = {"parameters": {**rebuild["parameters"], "svd": {"dim": 50}}, "paused": True}
            for _ in range(10):  # a busy SQLite server answers 503 for a moment; Prefect's own client retries it too
                status = api.patch(f"/deployments/{rebuild['id']}", json=edit).status_code
                if status != 503:
                    break
                time.sleep(1)
            assert status == 204
            assert read("corpus-rebuild")["parameters"]["svd"] == {"dim": 50}
            assert definitions.main(argv) == 0
            again = read("corpus-rebuild")
            assert again["parameters"] == rebuild["parameters"] and again["paused"]
    finally:
        serve._signal_and_wait(server, 15, 15) or serve._signal_and_wait(server, 9, 5)


def test_the_operations_table_lists_every_deployment_serve_deploys():
    import re

    table = next(part for part in (ROOT / "docs" / "operations.md").read_text(encoding="utf-8").split("\n\n")
                 if part.startswith("| deployment"))
    assert sorted(re.findall(r"^\| `[\w-]+/([\w-]+)` \|", table, re.M)) == sorted(spec.name for spec in DEPLOYMENTS)


def test_the_form_puts_the_essentials_first_with_titles_people_read():
    """The pipeline's Custom run form (the deployment's schema): the sections an operator changes most often first,
    every label in words (pydantic's would read "N Iter", "Lm Deployment"), no None toggle where 0 or "" serves."""
    from lexiflow.deployments.definitions import _strict
    from lexiflow.flows.pipeline import pipeline
    from lexiflow.tasks.params import title
    from prefect.utilities.callables import parameter_schema

    schema = _strict(parameter_schema(pipeline)).model_dump()
    order = list(schema["properties"])
    assert order[:5] == ["store", "corpus", "embeddings", "lm", "release"]
    assert order[-3:] == ["training", "parallel", "checks"]
    titles = {name: prop["title"] for name, prop in schema["properties"].items()}
    assert (titles["lm"], titles["svd"], titles["store"]) == ("Language models", "SVD", "Artifact store")
    fields = {name: prop for section in schema["definitions"].values() for name, prop in section["properties"].items()}
    assert all(prop["title"] == title(name) for name, prop in fields.items())
    assert (title("n_iter"), title("lm_deployment"), title("lr"), title("min_count")) == (
        "Iterations", "LM deployment", "Learning rate", "Min count")
    parallel = schema["definitions"]["ParallelParams"]["properties"]
    assert (parallel["shard_rows"]["type"], parallel["dask_address"]["type"]) == ("integer", "string")
