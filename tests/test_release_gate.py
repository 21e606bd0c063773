"""Scheduled rebuilds release only what passes, and a release starts the downstream job: a real `prefect server`
with a `cpu` and a `gpu` process worker (started by `deployments.serve`, as `lexiflow serve` does), corpus-rebuild
runs created as the UI's Run button creates them, and the `serve-release` example deployment started by its
deployment trigger on the `lexiflow.artifact.released` event."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gensim.test.utils import datapath
from lexiflow.deployments import serve
from lexiflow.deployments.definitions import DeployConfig
from lexiflow.storage import Catalog

from tests.test_orchestration import Box

# Small and quick; the lee corpus is too small for SimLex-999 (60k words: ρ ≈ 0.06, most pairs unseen), so that
# check only reports, and the first build's floor for WS-353 is 2 standard deviations of random vectors' ρ.
SMALL = {"vocabulary": {"min_count": 2}, "svd": {"dim": 20}, "embeddings": ["svd"], "lm": [],
         "evaluation": {"analogy_vocabulary": 1000, "projection_words": 0},
         "checks": {"similarity_floor_z": 2, "advisory": ["evaluation.simlex999_spearman"]}}
RELEASED = "lexiflow.artifact.released"


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    home, data = tmp_path_factory.mktemp("prefect-home"), tmp_path_factory.mktemp("data")
    lines = Path(datapath("lee_background.cor")).read_text(encoding="utf-8").splitlines(keepends=True)
    (data / "lee.txt").write_text("".join(lines), encoding="utf-8")
    (data / "tenth.txt").write_text("".join(lines[: len(lines) // 10]), encoding="utf-8")  # a truncated source
    config = DeployConfig(store=str(tmp_path_factory.mktemp("store")), sources=[str(data / "lee.txt")],
                          serving=str(tmp_path_factory.mktemp("serving")))
    try:
        yield Box(serve.start(home, config, worker_poll_seconds=2, cpu_limit=2), config, home)
    finally:
        serve.stop(home, grace=10)


def downstream_runs(box: Box) -> list[dict]:
    return box.flow_runs(deployment_id={"any_": [box.deployment_id("serve-release")]})


def released_events(box: Box, since: str, name: str = RELEASED) -> list[dict]:
    body = {"filter": {"event": {"name": [name]}, "occurred": {"since": since}}, "limit": 50}
    return box.api.post("/events/filter", json=body).json()["events"]


def rebuild(box: Box, **parameters) -> dict:
    response = box.create_run("corpus-rebuild", {**SMALL, **parameters})
    assert response.status_code == 201, response.text
    return box.wait(response.json()["id"])


def checks_table(box: Box, run: dict) -> list[dict]:
    found = box.api.post("/artifacts/filter", json={"artifacts": {
        "flow_run_id": {"any_": [run["id"]]}, "key": {"any_": ["release-checks"]}}}).json()
    assert len(found) == 1 and found[0]["type"] == "table"
    data = found[0]["data"]
    return json.loads(data) if isinstance(data, str) else data


@pytest.fixture(scope="module")
def passed(box):
    """The first rebuild (nothing released: floors), then the downstream run its release started."""
    run = rebuild(box)
    assert run["state"]["type"] == "COMPLETED", box.logs_tail()
    deadline, started = time.monotonic() + 240, []
    while time.monotonic() < deadline and not (started and started[0]["state"]["type"] in ("COMPLETED", "FAILED",
                                                                                            "CRASHED")):
        started = downstream_runs(box)
        time.sleep(2)
    return run, started


@pytest.mark.slow
def test_a_rebuild_that_passes_its_checks_moves_production_and_starts_the_downstream_run(box, passed):
    run, started = passed
    catalog = Catalog(box.config.store)
    embeddings, corpus = catalog.latest("embeddings"), catalog.latest("corpus")
    assert catalog.released("embeddings") == embeddings["version"]
    assert catalog.released("embeddings", "production-svd") == embeddings["version"]
    assert catalog.released("corpus") == corpus["version"]
    assert [entry["flow_run"] for entry in catalog.release_log("embeddings", "production")] == [run["id"]]
    rows = checks_table(box, run)
    assert {(row["artifact"], row["check"]) for row in rows} >= {
        ("corpus", "tokens"), ("tokenized_corpus", "held_out_coverage"), ("evaluation.svd", "ws353_spearman")}
    assert all(row["passed"] or not row["blocking"] for row in rows)
    # the event: its resource names kind, version, alias and store; the release started the downstream job
    events = released_events(box, run["start_time"])
    labels = [e["resource"] for e in events if e["resource"]["lexiflow.kind"] == "embeddings"]
    assert {(r["lexiflow.version"], r["lexiflow.alias"], r["lexiflow.store"]) for r in labels} == {
        (embeddings["version"], "production", box.config.store),
        (embeddings["version"], "production-svd", box.config.store)}
    # every artifact the run made was announced as published (no alias yet)
    published = {(e["resource"]["lexiflow.kind"], e["resource"]["lexiflow.version"], e["resource"]["lexiflow.alias"])
                 for e in released_events(box, run["start_time"], "lexiflow.artifact.published")}
    assert {("embeddings", embeddings["version"], ""), ("corpus", corpus["version"], "")} <= published
    assert {kind for kind, _, _ in published} >= {"checks", "report", "evaluation", "tokenized_corpus"}
    assert len(started) == 1 and started[0]["state"]["type"] == "COMPLETED", box.logs_tail()
    served = Path(box.config.serving)
    for kind in ("embeddings", "tokenizer"):
        current = served / kind / "current"
        assert current.resolve().name == catalog.released(kind)
        assert (current / "manifest.json").exists()
    assert (served / "embeddings" / "current" / "vectors.parquet").exists()


@pytest.mark.slow
def test_a_degraded_rebuild_releases_nothing_and_starts_nothing(box, passed, tmp_path):
    catalog = Catalog(box.config.store)
    aliases, log = catalog.aliases(), catalog.release_log("embeddings")
    tenth = str(Path(box.config.sources[0]).with_name("tenth.txt"))
    run = rebuild(box, corpus={"sources": [tenth]})
    assert run["state"]["type"] == "FAILED", box.logs_tail()
    message = run["state"]["message"]
    assert "release refused" in message and "corpus.tokens" in message and "\n" not in message
    assert catalog.aliases() == aliases and catalog.release_log("embeddings") == log  # nothing moved
    assert catalog.latest("corpus")["metrics"]["documents"] < catalog.get("corpus@production")["metrics"]["documents"]
    rows = {(row["artifact"], row["check"]): row for row in checks_table(box, run)}  # still published
    assert not rows[("corpus", "tokens")]["passed"]
    assert released_events(box, run["start_time"]) == []
    time.sleep(10)  # a trigger would have started a run by now (it reacts within seconds)
    assert len(downstream_runs(box)) == 1
