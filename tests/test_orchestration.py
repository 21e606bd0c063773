"""Production orchestration through real components on loopback: a `prefect server`, a `cpu` and a
`gpu` process worker (started by `deployments.serve`, exactly as `lexiflow serve` does), the
deployments, REST-triggered runs as the UI makes them, the cron schedule, the UI in headless
Chromium, and a plain (lexiflow-free) process reading the embeddings with DuckDB.

Fast unit tests first (registry, strict schemas, stop-by-PID), then the slow integration module.
Screenshots go to build/test-output/ (ignored by git). One file over 600 lines: its integration tests share one
module-scoped server and its workers (minutes to start), which pytest shares within a module only.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import get_args

import httpx
import numpy as np
import pytest
from lexiflow.deployments import serve
from lexiflow.deployments.definitions import DEFAULT_CRON, DEPLOYMENTS, DeployConfig, _strict, pool_name
from lexiflow.flows.pipeline import pipeline
from lexiflow.flows.training import (
    EMBEDDING_TRAINERS,
    FINETUNE_TRAINERS,
    LM_TRAINERS,
    PRETRAIN_TRAINERS,
    SEQ2SEQ_TRAINERS,
)
from lexiflow.loaders import load
from lexiflow.storage import Catalog
from lexiflow.storage.pieces import COMMIT, PIECES
from lexiflow.tasks.params import EmbeddingMethod, LMKind, Seq2SeqKind

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "build" / "test-output"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# GloVe trains on a GPU worker (training.remote); SVD runs where the flow runs.
SMALL = {"vocabulary": {"min_count": 2}, "svd": {"dim": 20}, "glove": {"dim": 20, "epochs": 2},
         "embeddings": ["svd", "glove"], "lm": [],
         "evaluation": {"analogy_vocabulary": 1000, "projection_words": 0},
         # 20-dimensional vectors of a 60k-word corpus are near random on word similarity: reported, not blocking
         # (corpus-rebuild releases what passes; tests/test_release_gate.py tests the gate)
         "checks": {"advisory": ["evaluation.ws353_spearman", "evaluation.simlex999_spearman"]}}


# ---- fast: definitions and parameter validation ----------------------------------------------
def test_deployments_registry_pools_and_schedule():
    config = DeployConfig(store="/data/store", sources=["/corpus/*.txt"])
    by_name = {spec.name: spec for spec in DEPLOYMENTS}
    assert set(by_name) == {"pipeline", "corpus-rebuild", "train-embeddings", "train-lm", "train-seq2seq",
                            "train-tagger", "pretrain", "finetune", "serve-release"}
    assert {name: pool_name(spec, config) for name, spec in by_name.items()} == {
        "pipeline": "cpu", "corpus-rebuild": "cpu", "train-embeddings": "gpu", "train-lm": "gpu",
        "train-seq2seq": "gpu", "train-tagger": "gpu", "pretrain": "gpu", "finetune": "gpu", "serve-release": "cpu"}
    assert by_name["corpus-rebuild"].cron(config) == DEFAULT_CRON == "0 3 * * 1"
    assert by_name["pipeline"].cron(config) is None
    assert by_name["corpus-rebuild"].parameters(config) == {
        "store": "/data/store", "corpus": {"sources": ["/corpus/*.txt"]}, "training": {"remote": True},
        "release": {"when": "always", "alias": "production"},  # a rebuild releases what passes its checks
        "parallel": {"pieces": True}}  # and rebuilds a grown corpus incrementally (per-piece partial results)
    assert "pieces" not in by_name["pipeline"].parameters(config).get("parallel", {})  # the manual run: off
    # a deploy config's parameters win over corpus-rebuild's default, section by section
    off = DeployConfig(store="/data/store", parameters={"parallel": {"pieces": False, "workers": 4}})
    assert by_name["corpus-rebuild"].parameters(off)["parallel"] == {"pieces": False, "workers": 4}
    assert by_name["corpus-rebuild"].parameters(DeployConfig(parameters={"parallel": {"workers": 4}}))["parallel"] \
        == {"pieces": True, "workers": 4}
    trigger, = by_name["serve-release"].triggers(config)  # the downstream example starts on a release
    assert trigger.expect == {"lexiflow.artifact.released"}
    assert trigger.match.root == {"lexiflow.kind": "embeddings", "lexiflow.alias": "production",
                             "lexiflow.store": "/data/store"}
    # one list of choices (tasks/params.py) for the pipeline's form and the training flows' drop-downs
    assert set(EMBEDDING_TRAINERS) == set(get_args(EmbeddingMethod)) == {"svd", "lsi", "sgns", "cbow", "glove"}
    assert set(LM_TRAINERS) == set(get_args(LMKind)) == {"ngram", "ffnn", "rnn", "lstm", "gru", "transformer"}
    assert set(SEQ2SEQ_TRAINERS) == set(get_args(Seq2SeqKind)) == {"rnn", "transformer"}
    assert set(PRETRAIN_TRAINERS) == {"encoder"}
    assert set(FINETUNE_TRAINERS) == {f"{t}-{m}" for t in ("upos", "genre")
                                      for m in ("scratch", "frozen", "full", "adapters", "lora")}


def test_strict_schema_rejects_unknown_names_at_every_level():
    """The schema the API enforces at run creation (the same validator the server calls)."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    schema = _strict(parameter_schema(pipeline)).model_dump(exclude_unset=True)
    validate({"store": "s", "svd": {"dim": 20}}, schema, raise_on_error=True)
    for bad, where in (({"bogus": 1}, "'bogus' was unexpected"), ({"svd": {"dimm": 3}}, "'dimm' was unexpected"),
                       ({"svd": {"dim": 1}}, "svd.dim"), ({"embeddings": []}, "[] should be non-empty")):
        with pytest.raises(ValidationError, match=re.escape(where)):
            validate(bad, schema, raise_on_error=True)
    # the UI renders descriptions as HTML: <unk> and </w> arrive escaped, so they show instead of vanishing
    descriptions = " ".join(field.get("description", "") for section in schema["definitions"].values()
                            for field in section["properties"].values())
    assert "Words seen fewer times in the train split become &lt;unk&gt;." in descriptions
    assert "&lt;/w&gt;" in descriptions and "<" not in descriptions


def test_flow_entry_rejects_unknown_and_invalid_parameters():
    """What a run created without schema enforcement meets first, before any stage."""
    from prefect.exceptions import ParameterTypeError, SignatureMismatchError

    with pytest.raises(SignatureMismatchError, match="bogus"):
        pipeline.validate_parameters({"bogus": 1})
    with pytest.raises(ParameterTypeError, match="dim"):
        pipeline.validate_parameters({"svd": {"dim": 1}})
    assert pipeline.validate_parameters({"svd": {"dim": 20}})["svd"].dim == 20


# ---- the hand-off to the gpu pool, with an in-process stand-in for the worker -------------------
@pytest.mark.prefect
def test_remote_training_runs_the_configured_deployments_and_finds_what_they_published(tmp_path, monkeypatch):
    """train(remote) predicts the lm version before handing off; the train-lm run calls the stage
    as Prefect does, with the default `embeddings=None` filled in: both must give one version. Each
    kind goes to the deployment its `training.*_deployment` setting names."""
    import polars as pl
    from lexiflow.flows.params import TrainingParams
    from lexiflow.flows.training import train, train_lm
    from lexiflow.storage import ArtifactStore
    from lexiflow.storage.formats import TOKENS, VOCAB
    from lexiflow.tasks.params import GloVeParams, NeuralLMParams, NgramParams, SVDParams
    from prefect import flow
    from prefect.states import Failed, Scheduled
    from prefect.testing.utilities import prefect_test_harness

    store = ArtifactStore(tmp_path / "store")
    with store.writer("tokenizer", "0" * 16) as out:
        out.write_parquet("vocab.parquet", pl.DataFrame({"id": range(6), "token": ["<unk>", "<s>", "</s>", "<pad>",
                                                                                   "a", "b"], "count": [0] * 6}), VOCAB)
    with store.writer("tokenized_corpus", "1" * 16) as out:
        out.write_parquet("tokens.parquet", pl.DataFrame({
            "doc_index": range(4), "sentence": [0] * 4, "split": ["train", "train", "valid", "test"],
            "ids": [[4, 5, 4], [5, 4], [4, 5], [5, 5]]}), TOKENS)
    training = TrainingParams(remote=True, embeddings_deployment="gpu-emb/custom", lm_deployment="gpu-lm/custom")
    handed_off = []

    def gpu_worker(deployment, parameters, **_options):  # what a worker of the gpu pool runs
        handed_off.append(deployment)
        if deployment == "gpu-emb/idle":  # no gpu worker picked it up before the timeout
            return SimpleNamespace(state=Scheduled(), name="idle-run", id="1")
        state = train_lm(**parameters, return_state=True) if deployment == "gpu-lm/custom" else Failed()
        return SimpleNamespace(state=state, name="gpu-run", id="0")

    monkeypatch.setattr("lexiflow.flows.training.run_deployment", gpu_worker)

    tiny = NeuralLMParams(emb_dim=4, hidden_dim=4, num_layers=1, batch_size=1, bptt=2, max_steps=1, epochs=1,
                          device="cpu")

    @flow
    def handoff():
        inputs = {"tokens": store.ref("tokenized_corpus", "1" * 16), "tokenizer": store.ref("tokenizer", "0" * 16),
                  "embeddings": None}  # as the pipeline passes them for a model without pretrained vectors
        lm = train(LM_TRAINERS["lstm"], "lstm", store.url, inputs, tiny, training)
        ngram = train(LM_TRAINERS["ngram"], "ngram", store.url, inputs, NgramParams(order=2), training)  # here: CPU
        cooccurrence = {"cooccurrence": store.ref("cooccurrence", "2" * 16)}
        with pytest.raises(RuntimeError, match="gpu-emb/custom ended Failed"):
            train(EMBEDDING_TRAINERS["glove"], "glove", store.url, cooccurrence, GloVeParams(), training)
        idle = training.model_copy(update={"embeddings_deployment": "gpu-emb/idle", "timeout_minutes": 0.5})
        with pytest.raises(RuntimeError, match=re.escape(  # it said "ended Scheduled: None"
                "gpu-emb/idle did not finish within training.timeout_minutes=0.5 (it is Scheduled; is a worker")):
            train(EMBEDDING_TRAINERS["glove"], "glove", store.url, cooccurrence, GloVeParams(), idle)
        with pytest.raises(FileNotFoundError, match="ppmi"):  # SVD runs here: it reads its (missing) input itself
            train(EMBEDDING_TRAINERS["svd"], "svd", store.url, {"ppmi": store.ref("ppmi", "3" * 16)}, SVDParams(),
                  training)
        return lm, ngram

    with prefect_test_harness(server_startup_timeout=120):
        lm, ngram = handoff()
    assert handed_off == ["gpu-lm/custom", "gpu-emb/custom", "gpu-emb/idle"]  # neither n-gram nor SVD
    assert {m["version"] for m in Catalog(store.url).list("lm")} == {lm.version, ngram.version}
    for ref, kind in ((lm, "cpu"), (ngram, "cpu")):  # every training manifest says what it ran on
        device = Catalog(store.url).get("lm", ref.version)["metrics"]["device"]
        assert device["type"] == kind and device["count"] == 1 and device["precision"] in ("fp32", "fp64")
        assert device["name"]


def test_remote_neural_tagger_and_biLM_publish_the_versions_the_pipeline_expects(tmp_path, monkeypatch):
    """The elmo biLM and a bilstm+elmo tagger handed to the train-tagger deployment: the run's stage call
    (elmo given as an input version, kind and column as fixed arguments) gives the predicted version."""
    import polars as pl
    from lexiflow.flows.params import TrainingParams
    from lexiflow.flows.training import TAGGER_TRAINERS, train, train_tagger_flow
    from lexiflow.loaders import load
    from lexiflow.storage import ArtifactStore
    from lexiflow.storage.formats import DOCUMENTS, TAGGED
    from lexiflow.tasks.params import ElmoParams, TaggerParams
    from prefect import flow
    from prefect.testing.utilities import prefect_test_harness

    store = ArtifactStore(tmp_path / "store")
    words = [["the", "dog", "runs"], ["a", "cat", "sleeps"], ["the", "cat", "runs"], ["a", "dog", "sleeps"]]
    with store.writer("corpus", "0" * 16) as out:
        out.write_parquet("documents.parquet", pl.DataFrame({
            "doc_id": ["a", "b", "c", "d"], "source": ["x"] * 4, "split": ["train", "train", "valid", "test"],
            "text": [" ".join(w) for w in words]}), DOCUMENTS)
    with store.writer("tagged_corpus", "1" * 16) as out:
        out.write_parquet("sentences.parquet", pl.DataFrame({
            "sent_id": ["1", "2", "3", "4"], "source": ["x"] * 4, "split": ["train", "train", "valid", "test"],
            "words": words, "upos": [["DET", "NOUN", "VERB"]] * 4, "xpos": [["DT", "NN", "VBZ"]] * 4}), TAGGED)
    training = TrainingParams(remote=True, tagger_deployment="gpu-tag/custom")
    handed_off = []

    def gpu_worker(deployment, parameters, **_options):  # what a worker of the gpu pool runs
        handed_off.append((deployment, parameters["method"], sorted(parameters["inputs"])))
        return SimpleNamespace(state=train_tagger_flow(**parameters, return_state=True), name="gpu-run", id="0")

    monkeypatch.setattr("lexiflow.flows.training.run_deployment", gpu_worker)
    tagger = TaggerParams(kinds=["bilstm+elmo"], columns=["upos"], hidden_dim=4, epochs=1, device="cpu")
    elmo = ElmoParams(dim=4, hidden_dim=8, max_vocab=20, device="cpu")

    @flow
    def handoff():
        bilm = train(TAGGER_TRAINERS["elmo"], "elmo", store.url, {"corpus": store.ref("corpus", "0" * 16)}, elmo,
                     training)
        inputs = {"tagged": store.ref("tagged_corpus", "1" * 16), "elmo": bilm}
        return bilm, train(TAGGER_TRAINERS["bilstm+elmo:upos"], "bilstm+elmo:upos", store.url, inputs, tagger,
                           training)

    with prefect_test_harness(server_startup_timeout=120):
        bilm, ref = handoff()
    assert handed_off == [("gpu-tag/custom", "elmo", ["corpus"]),
                          ("gpu-tag/custom", "bilstm+elmo:upos", ["elmo", "tagged"])]
    manifest = store.manifest("tagger", ref.version)
    assert manifest["metrics"]["model"] == "bilstm+elmo" and manifest["inputs"]["elmo"]["version"] == bilm.version
    assert load(store.url, "tagger", ref.version).tag(["the", "dog", "runs"])[0] in ("DET", "NOUN", "VERB")


def test_train_tagger_flow_refuses_pretrained_without_vectors_and_vectors_without_pretrained(tmp_path):
    """From the train-tagger form: tagger.pretrained and inputs.vectors must agree, as for the LMs."""
    from lexiflow.flows.training import train_tagger_flow
    from lexiflow.models.errors import ParameterError
    from lexiflow.tasks.params import TaggerParams

    with pytest.raises(ParameterError, match=r"^tagger.pretrained=sgns needs inputs.vectors"):
        train_tagger_flow.fn(str(tmp_path), "bilstm:upos", {}, tagger=TaggerParams(pretrained="sgns"))
    with pytest.raises(ParameterError, match=r"^inputs.vectors is given but tagger.pretrained=none"):
        train_tagger_flow.fn(str(tmp_path), "bilstm:upos", {"vectors": "latest"}, tagger=TaggerParams())


def test_train_lm_flow_refuses_pretrained_without_embeddings_and_embeddings_without_pretrained(tmp_path):
    """From the train-lm form: neural.pretrained=svd without inputs.embeddings trained from random vectors,
    and inputs.embeddings with pretrained=none initialised from them; both silently."""
    from lexiflow.flows.training import train_lm
    from lexiflow.models.errors import ParameterError
    from lexiflow.tasks.params import NeuralLMParams

    with pytest.raises(ParameterError, match=r"^neural.pretrained=svd needs inputs.embeddings"):
        train_lm.fn(str(tmp_path), "lstm", {}, neural=NeuralLMParams(pretrained="svd"))
    with pytest.raises(ParameterError, match=r"^inputs.embeddings is given but neural.pretrained=none"):
        train_lm.fn(str(tmp_path), "gru", {"embeddings": "latest"})


@pytest.mark.prefect
def test_redeploying_keeps_a_schedule_or_deployment_paused_in_the_ui(tmp_path):
    """`lexiflow serve` restarted (or a redeploy after a code change) set a paused corpus-rebuild active again."""
    from lexiflow.deployments.definitions import deploy
    from prefect import get_client
    from prefect.testing.utilities import prefect_test_harness

    config = DeployConfig(store=str(tmp_path / "store"))
    with prefect_test_harness(server_startup_timeout=120):
        ids = deploy(config, only=["corpus-rebuild", "pipeline"])
        with get_client(sync_client=True) as client:
            rebuild = client.read_deployment(ids["pipeline/corpus-rebuild"])
            client.update_deployment_schedule(rebuild.id, rebuild.schedules[0].id, active=False)  # the UI's toggles
            client.pause_deployment(ids["pipeline/pipeline"])
            deploy(config.model_copy(update={"rebuild_cron": "0 4 * * 2"}), only=["corpus-rebuild", "pipeline"])
            rebuild, manual = (client.read_deployment(ids[name]) for name in ("pipeline/corpus-rebuild",
                                                                             "pipeline/pipeline"))
    assert [(s.schedule.cron, s.active) for s in rebuild.schedules] == [("0 4 * * 2", False)]
    assert (manual.paused, rebuild.paused) == (True, False)


def test_a_deployed_run_failing_on_bad_input_logs_the_error_once_without_calling_it_unexpected():
    """A worker's run that failed on bad input ended its log with Prefect's "Engine execution exited with
    unexpected exception" (ERROR): the user error, already logged in one line, is expected."""
    import logging
    import sys

    from lexiflow.models.errors import InputError
    from lexiflow.tasks.stage import UserErrorsOnOneLine

    def record(msg, exc):
        try:
            raise exc
        except Exception:
            return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, msg, None, sys.exc_info())

    one_line = UserErrorsOnOneLine()
    assert not one_line.filter(record("Engine execution exited with unexpected exception", InputError("a.txt:2: bad")))
    kept = record("Encountered exception during execution: %r", InputError("a.txt:2: bad"))
    assert one_line.filter(kept) and kept.exc_info is None
    bug = record("Engine execution exited with unexpected exception", KeyError("bug"))
    assert one_line.filter(bug) and bug.exc_info is not None  # a bug keeps its traceback


def test_a_retried_stage_moves_one_progress_bar_instead_of_leaving_a_stuck_one(monkeypatch):
    """Each attempt of a task run created its own progress artifact: after a transient failure at 40 % the run
    page kept a bar stuck at 40 % beside the retry's."""
    from lexiflow.tasks import stage as stage_module

    calls = []
    monkeypatch.setattr(stage_module, "create_progress_artifact",
                        lambda value, description: calls.append(("create", value)) or "artifact-1")
    monkeypatch.setattr(stage_module, "update_progress_artifact", lambda i, value: calls.append((i, value)))
    monkeypatch.setattr(stage_module, "task_run", SimpleNamespace(id="task-run-1"))
    first = stage_module._progress_artifact("corpus")  # attempt 1: fails at 40 %
    first(0.2), first(0.4)
    retry = stage_module._progress_artifact("corpus")  # attempt 2 of the same task run
    retry(0.5), retry(1.0)
    assert calls == [("create", 20.0), ("artifact-1", 40.0), ("artifact-1", 50.0), ("artifact-1", 100.0)]
    monkeypatch.setattr(stage_module, "task_run", SimpleNamespace(id="task-run-2"))
    stage_module._progress_artifact("corpus")(0.1)  # another task run: its own bar
    assert calls[-1] == ("create", 10.0)


def test_evaluation_table_rows_carry_every_column(tmp_path, monkeypatch):
    """The UI's table artifact takes its columns from the first row (an embeddings evaluation): the language
    models' perplexities, in later rows only, were not shown."""
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks import report as report_module

    store = ArtifactStore(tmp_path / "store")
    refs = {}
    for kind, version, metrics in (("evaluation", "1" * 16, {"method": "svd", "ws353_spearman": 0.5}),
                                   ("lm", "2" * 16, {"model": "ngram", "test_perplexity": 120.0})):
        with store.writer(kind, version) as out:
            out.write_text("x.txt", "x")
            out.metrics.update(metrics)
        refs[kind] = store.ref(kind, version)
    with store.writer("report", "3" * 16, inputs={"evaluations.0": refs["evaluation"], "lms.0": refs["lm"]}) as out:
        out.write_text("report.md", "# report\n")
    tables = []
    monkeypatch.setattr(report_module, "create_table_artifact", lambda rows, **_options: tables.append(rows))
    monkeypatch.setattr(report_module, "create_markdown_artifact", lambda *a, **k: None)
    charts = []
    monkeypatch.setattr(report_module, "publish_chart", charts.append)
    report_module.publish_report(store.ref("report", "3" * 16))
    (first, second), = tables
    assert list(first) == list(second)
    assert (first["test_perplexity"], second["test_perplexity"], second["ws353_spearman"]) == (None, 120.0, None)
    (chart,), = charts  # the headline chart draws the embeddings' evaluations only, not the LM's empty row
    assert (chart["embeddings"], chart["ws353_spearman"]) == ("svd", 0.5)


# ---- fast: stop by PID --------------------------------------------------------------------
def _record(home: Path, procs: list[serve.Started]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / serve.SERVE_STATE).write_text(json.dumps({"processes": [p.__dict__ for p in procs]}))


def test_serve_already_running_names_the_home_to_stop_it_with(tmp_path, capsys, monkeypatch):
    from lexiflow.flows.cli import main

    running = subprocess.Popen(["sleep", "30"])
    try:
        home = tmp_path / "elsewhere"
        _record(home, [serve.Started("server", running.pid, serve.start_ticks(running.pid), "")])
        state = json.loads((home / serve.SERVE_STATE).read_text())
        (home / serve.SERVE_STATE).write_text(json.dumps({**state, "ui_url": "http://127.0.0.1:1"}))
        monkeypatch.setattr(serve, "_spawn", lambda *a, **k: pytest.fail("serve started a process"))
        assert main(["serve", "--home", str(home)]) == 2
        assert capsys.readouterr().err.strip().endswith(f"stop it first with `lexiflow serve --stop --home {home}`")
    finally:
        running.kill()
        running.wait()


def test_stop_never_signals_a_process_that_only_reuses_a_recorded_pid(tmp_path):
    other = subprocess.Popen(["sleep", "30"])
    try:
        ticks = serve.start_ticks(other.pid)
        _record(tmp_path, [serve.Started("server", other.pid, ticks + 1, "")])  # same PID, another start time
        assert serve.stop(tmp_path, grace=1) == [f"server (pid {other.pid}): not running"]
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_stop_sends_a_second_sigterm_to_a_process_that_survives_the_first(tmp_path):
    stubborn = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import signal, sys, time
        hits = []
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0) if hits else hits.append(1))
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        _record(tmp_path, [serve.Started("worker-gpu0", stubborn.pid, serve.start_ticks(stubborn.pid), "")])
        assert serve.stop(tmp_path, grace=2) == [f"worker-gpu0 (pid {stubborn.pid}): stopped (second SIGTERM)"]
        assert stubborn.wait(timeout=5) == 0
        assert not (tmp_path / serve.SERVE_STATE).exists()
    finally:
        if stubborn.poll() is None:
            stubborn.kill()


def test_serve_cli_stop_with_nothing_started(tmp_path, capsys):
    from lexiflow.flows.cli import main

    assert main(["serve", "--stop", "--home", str(tmp_path)]) == 0
    assert "nothing to stop" in capsys.readouterr().out
    for damaged in ("", "{", '{"processes": 1}', '{"processes": [{"pid": 1}]}', "[]"):
        (tmp_path / serve.SERVE_STATE).write_text(damaged)
        assert main(["serve", "--stop", "--home", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {tmp_path / serve.SERVE_STATE} is damaged") and "delete the file" in err


@pytest.mark.parametrize("option, value, message", [
    ("--cron", "bad", "--cron 'bad' (or LEXIFLOW_REBUILD_CRON): not a cron expression; use 5 fields"),
    ("--cron", "61 3 * * 1", "--cron '61 3 * * 1'"),
])
def test_serve_refuses_a_bad_cron_in_one_line_before_starting_anything(tmp_path, capsys, monkeypatch, option, value,
                                                                        message):
    """A typo in --cron used to start the Prefect server, deploy `pipeline`, then end in a pydantic traceback."""
    from lexiflow.flows.cli import main

    monkeypatch.setattr(serve, "_spawn", lambda *a, **k: pytest.fail("serve started a process"))
    assert main(["serve", "--home", str(tmp_path / "home"), option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "home").exists()


def test_serve_on_a_port_another_server_answers_refuses_instead_of_deploying_there(tmp_path, capsys, monkeypatch):
    """The new server cannot bind a taken port, but the health check used to find the other server answering
    and deployed onto it (and pointed the workers at it)."""
    import http.server
    import threading

    from lexiflow.flows.cli import main

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_address[1]
    monkeypatch.setattr(serve, "_spawn", lambda *a, **k: pytest.fail("serve started a process"))
    try:
        assert main(["serve", "--home", str(tmp_path / "home"), "--port", str(port)]) == 2
    finally:
        other.shutdown()
    assert capsys.readouterr().err.startswith(f"error: port {port} on 127.0.0.1 is in use")
    assert not (tmp_path / "home").exists()  # a refused serve leaves no folder behind


def test_serve_keeps_a_store_url_and_makes_local_corpus_paths_absolute(tmp_path, monkeypatch):
    """`serve --store s3://bucket/x` deployed the store `<cwd>/s3:/bucket/x`; a relative --corpus was read by
    corpus-rebuild from the code folder (the runs' working directory), not from where serve was started."""
    from lexiflow.flows.cli import main

    configs = []

    def start(home, config, **_options):
        configs.append(config)
        return {"ui_url": "u", "api_url": "a", "deployments": {}, "processes": []}

    monkeypatch.setattr(serve, "start", start)
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--home", "h", "--store", "s3://bucket/lexiflow", "--corpus", "data/*.txt",
                 "builtin:lee", "/abs/a.txt"]) == 0
    assert main(["serve", "--home", "h", "--store", "store"]) == 0
    assert configs[0].store == "s3://bucket/lexiflow"
    assert configs[0].sources == [f"{tmp_path}/data/*.txt", "builtin:lee", "/abs/a.txt"]
    assert configs[1].store == f"{tmp_path}/store"


def test_deploying_a_bad_schedule_fails_before_any_pool_or_deployment(capsys, monkeypatch):
    from lexiflow.deployments import definitions

    monkeypatch.setattr(definitions, "ensure_pools", lambda c: pytest.fail("pools created"))
    assert definitions.main(["--cron", "0 3 * * 1", "--timezone", "Mars/Base"]) == 2
    assert capsys.readouterr().err == "error: --timezone 'Mars/Base': not an IANA time zone (e.g. UTC, Europe/Berlin)\n"


# ---- slow: the whole thing on loopback ----------------------------------------------------
class Api:
    """The REST API, retried as Prefect's own client does: on 503/429 (SQLite busy under load, the
    request did nothing) and on transport errors, with backoff."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=120)  # a busy 2-core box answers slowly

    def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        for attempt in range(8):
            try:
                response = self.client.request(method, url, **kwargs)
            except httpx.TransportError:
                if attempt == 7:
                    raise
            else:
                if response.status_code not in (429, 503) or attempt == 7:
                    return response
            time.sleep(min(2**attempt, 15))
        raise AssertionError("unreachable")

    def get(self, url: str, **kwargs) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs) -> httpx.Response:
        return self.request("POST", url, **kwargs)


class Box:
    def __init__(self, state: dict, config: DeployConfig, home: Path) -> None:
        self.state, self.config, self.home = state, config, home
        self.api = Api(state["api_url"])

    def deployment_id(self, name: str) -> str:
        return next(i for full, i in self.state["deployments"].items() if full.endswith(f"/{name}"))

    def create_run(self, deployment: str, parameters: dict, **extra) -> httpx.Response:
        """POST /api/deployments/{id}/create_flow_run, the request the UI's Run button sends."""
        return self.api.post(f"/deployments/{self.deployment_id(deployment)}/create_flow_run",
                             json={"parameters": parameters, **extra})

    def wait(self, run_id: str, timeout: float = 480) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.api.get(f"/flow_runs/{run_id}").json()
            if run["state"]["type"] in TERMINAL:
                return run
            time.sleep(2)
        raise AssertionError(f"run {run_id} not finished after {timeout} s; worker logs:\n" + self.logs_tail())

    def flow_runs(self, **flow_run_filter) -> list[dict]:
        return self.api.post("/flow_runs/filter", json={"flow_runs": flow_run_filter}).json()

    def logs(self, run_id: str) -> list[str]:
        return [log["message"] for log in self.api.post(
            "/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200}).json()]

    def logs_tail(self) -> str:
        return "\n".join(f"--- {p['name']}\n" + Path(p["log"]).read_text()[-3000:]
                         for p in self.state["processes"] if Path(p["log"]).exists())


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect-home")  # an isolated PREFECT_HOME for this session
    store = tmp_path_factory.mktemp("store")
    config = DeployConfig(store=str(store), sources=["builtin:lee"], serving=str(tmp_path_factory.mktemp("serving")))
    try:
        yield Box(serve.start(home, config, worker_poll_seconds=2, cpu_limit=3), config, home)
    finally:
        serve.stop(home, grace=10)  # idempotent: test_stop... has usually done it already


@pytest.fixture(scope="module")
def runs(box):
    """The pipeline deployment run as the UI makes it (remote training) and, beside it, two runs
    created with schema enforcement switched off: one with an unknown name, one with a value out
    of bounds."""
    requests = {"pipeline": ({"store": box.config.store, "corpus": {"sources": ["builtin:lee"]}, **SMALL,
                              "training": {"remote": True}}, {}),
                "unknown": ({"store": box.config.store, "bogus": 1}, {"enforce_parameter_schema": False}),
                "invalid": ({"store": box.config.store, "svd": {"dim": 1}}, {"enforce_parameter_schema": False})}
    ids = {}
    for name, (parameters, extra) in requests.items():
        response = box.create_run("pipeline", parameters, **extra)
        assert response.status_code == 201, response.text
        ids[name] = response.json()["id"]
    return {name: box.wait(run_id) for name, run_id in ids.items()}


@pytest.mark.slow
def test_api_refuses_unknown_or_invalid_parameters_before_a_run_exists(box):
    pipeline_runs = {"deployment_id": {"any_": [box.deployment_id("pipeline")]}}  # (the cron adds its own runs)
    before = len(box.flow_runs(**pipeline_runs))
    for parameters, message in (({"bogus": 1}, "Additional properties are not allowed ('bogus' was unexpected)"),
                                ({"svd": {"dimm": 20}}, "'dimm' was unexpected"),
                                ({"svd": {"dim": 1}}, "Validation failed for field 'svd.dim'")):
        response = box.create_run("pipeline", parameters)
        assert response.status_code == 409 and message in response.json()["detail"], response.text
    assert len(box.flow_runs(**pipeline_runs)) == before


@pytest.mark.slow
def test_runs_without_schema_enforcement_stop_at_flow_entry_before_any_stage(box, runs):
    """A client may switch enforcement off per run. Then a bad value fails at the flow's entry
    (pydantic bounds), and an unknown name stops Prefect's engine before the flow (it reports the
    run as Crashed, the log names the parameters). Either way no stage starts."""
    invalid, unknown = runs["invalid"], runs["unknown"]
    assert invalid["state"]["type"] == "FAILED"
    assert "Validation of flow parameters failed" in invalid["state"]["message"]
    assert any("svd.dim" in line and "greater than or equal to 2" in line for line in box.logs(invalid["id"]))
    assert unknown["state"]["type"] == "CRASHED"
    assert any("SignatureMismatchError" in line and "'bogus'" in line for line in box.logs(unknown["id"]))
    for run in (invalid, unknown):
        assert box.api.post("/task_runs/filter", json={"flow_runs": {"id": {"any_": [run["id"]]}}}).json() == []


@pytest.mark.slow
def test_pipeline_run_hands_training_to_the_gpu_worker(box, runs):
    run = runs["pipeline"]
    assert run["state"]["type"] == "COMPLETED", box.logs_tail()
    assert run["work_pool_name"] == "cpu"
    children = box.flow_runs(parent_flow_run_id={"any_": [run["id"]]})
    training = [c for c in children if c["deployment_id"] == box.deployment_id("train-embeddings")]
    assert len(training) == 1
    child = training[0]
    assert child["state"]["type"] == "COMPLETED" and child["work_pool_name"] == "gpu"
    logs = "\n".join(box.logs(child["id"]))
    assert re.search(r"Worker 'gpu0-[^']+' submitting flow run", logs)
    assert "CUDA_VISIBLE_DEVICES=0" in logs  # the GPU worker's environment reached the training run
    assert "CUDA_VISIBLE_DEVICES=<unset>" not in logs
    # The artifact came through the store: the embeddings were published by the GPU run.
    catalog = Catalog(box.config.store)
    embeddings = catalog.latest("embeddings", method="glove")
    assert embeddings["run"]["flow_run_id"] == child["id"]
    assert embeddings["metrics"]["dim"] == 20
    assert embeddings["metrics"]["device"]["type"] == "cpu"  # this machine has no GPU: the manifest says so
    assert "torch sees no CUDA GPU here" in logs  # and the gpu worker's run warned
    # SVD needs no GPU: it ran in the pipeline's own process, no training run for it
    assert catalog.latest("embeddings", method="svd")["run"]["flow_run_id"] == run["id"]
    assert "torch sees no CUDA GPU" in Path(box.home / "logs" / "worker-gpu0.log").read_text().splitlines()[0]


@pytest.mark.slow
def test_catalog_shows_the_new_artifacts_with_lineage(box, runs):
    catalog = Catalog(box.config.store)
    assert set(catalog.kinds()) == {"corpus", "tokenizer", "tokenized_corpus", "cooccurrence", "ppmi", "embeddings",
                                    "evaluation", "checks", "report"}
    report = catalog.latest("evaluation", method="svd")
    assert report["run"]["flow_run_id"] == runs["pipeline"]["id"]
    lineage = catalog.lineage(report["version"])
    embeddings = lineage["inputs"]["embeddings"]
    assert embeddings["parameters"]["params"]["dim"] == 20
    ppmi = embeddings["inputs"]["ppmi"]
    corpus = ppmi["inputs"]["cooccurrence"]["inputs"]["tokens"]["inputs"]["corpus"]
    assert corpus["kind"] == "corpus" and corpus["parameters"]["params"]["sources"] == ["builtin:lee"]
    # The pipeline run itself shows every artifact it used or made, with its readable location and lineage.
    shown = box.api.post("/artifacts/filter", json={"artifacts": {
        "key": {"any_": ["run-artifacts", "run-lineage"]}, "flow_run_id": {"any_": [runs["pipeline"]["id"]]}}}).json()
    assert {a["key"] for a in shown} == {"run-artifacts", "run-lineage"}
    markdown = next(a["data"] for a in shown if a["key"] == "run-artifacts")
    for manifest in (report, catalog.latest("embeddings", method="glove"), catalog.latest("corpus")):  # made here,
        assert f"`{catalog.store.path(manifest['kind'], manifest['version'])}`" in markdown  # on the GPU, an input


@pytest.mark.slow
def test_corpus_rebuild_on_unchanged_sources_changes_nothing(box, runs):
    before = {(m["kind"], m["version"]) for m in Catalog(box.config.store).list()}
    response = box.create_run("corpus-rebuild", SMALL)  # sources, store, remote training: the deployment's
    assert response.status_code == 201, response.text
    run = box.wait(response.json()["id"])
    assert run["state"]["type"] == "COMPLETED", box.logs_tail()
    assert {(m["kind"], m["version"]) for m in Catalog(box.config.store).list()} == before
    assert box.flow_runs(parent_flow_run_id={"any_": [run["id"]]}) == []  # no GPU run was needed


@pytest.mark.slow
def test_cron_schedule_creates_scheduled_runs(box):
    deadline, scheduled = time.monotonic() + 90, []
    while time.monotonic() < deadline and not scheduled:
        scheduled = box.flow_runs(deployment_id={"any_": [box.deployment_id("corpus-rebuild")]},
                                  state={"type": {"any_": ["SCHEDULED"]}})
        time.sleep(2)
    assert scheduled, "the scheduler created no run for corpus-rebuild"
    for run in scheduled:
        start = dt.datetime.fromisoformat(run["expected_start_time"])
        assert (start.weekday(), start.hour, start.minute) == (0, 3, 0)  # Mondays 03:00 UTC
        assert run["work_pool_name"] == "cpu"
    deployment = box.api.get(f"/deployments/{box.deployment_id('corpus-rebuild')}").json()
    assert deployment["description"].endswith("Runs at cron '0 3 * * 1', time zone UTC.")  # shown in the UI


def _chromium(url: str, *mode: str) -> subprocess.CompletedProcess:
    browser = shutil.which("chromium")
    assert browser, "headless Chromium is missing: `make test` installs Debian's chromium package"
    profile = OUTPUT / "chromium-profile"
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--window-size=1400,900",
                           *mode, url], capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_ui_renders_the_deployment_and_the_evaluation_table(box, runs):
    from lexiflow.tasks.report import for_people

    OUTPUT.mkdir(parents=True, exist_ok=True)
    ui = box.state["ui_url"]
    deployment_page = f"{ui}/deployments/deployment/{box.deployment_id('corpus-rebuild')}"
    dom = _chromium(deployment_page, "--dump-dom").stdout
    (OUTPUT / "deployment-corpus-rebuild.html").write_text(dom)
    assert "Deployment: corpus-rebuild" in dom and "At 03:00 AM, only on Monday" in dom  # name and cron
    _chromium(deployment_page + "?tab=Parameters", f"--screenshot={OUTPUT / 'deployment-corpus-rebuild.png'}")

    artifacts = box.api.post("/artifacts/filter", json={"artifacts": {
        "flow_run_id": {"any_": [runs["pipeline"]["id"]]}, "key": {"any_": ["evaluation-table"]}}}).json()
    assert len(artifacts) == 1 and artifacts[0]["type"] == "table"
    artifact_page = f"{ui}/artifacts/artifact/{artifacts[0]['id']}"
    dom = _chromium(artifact_page, "--dump-dom").stdout
    (OUTPUT / "evaluation-table.html").write_text(dom)
    report = Catalog(box.config.store).latest("evaluation")
    assert "ws353_spearman" in dom and f"evaluation:{report['version']}" in dom
    assert f"{for_people(report['metrics']['ws353_spearman'])}" in dom  # as the table rounds it for people
    _chromium(artifact_page, f"--screenshot={OUTPUT / 'evaluation-table.png'}")

    charts = box.api.post("/artifacts/filter", json={"artifacts": {
        "flow_run_id": {"any_": [runs["pipeline"]["id"]]}, "key": {"any_": ["embedding-evaluation-chart"]}}}).json()
    assert len(charts) == 1 and charts[0]["type"] == "image"
    assert charts[0]["data"].startswith("data:image/png;base64,")
    chart_page = f"{ui}/artifacts/artifact/{charts[0]['id']}"
    assert 'src="data:image/png;base64,' in _chromium(chart_page, "--dump-dom").stdout
    _chromium(chart_page, f"--screenshot={OUTPUT / 'evaluation-chart.png'}")
    for name in ("deployment-corpus-rebuild.png", "evaluation-table.png", "evaluation-chart.png"):
        assert (OUTPUT / name).stat().st_size > 10_000


@pytest.mark.slow
def test_a_plain_process_reads_the_latest_embeddings_with_duckdb(box, runs, tmp_path):
    script = textwrap.dedent("""
        import glob, json, sys
        import duckdb
        root = sys.argv[1]
        manifests = [json.load(open(p)) for p in glob.glob(f"{root}/embeddings/*/manifest.json")]
        latest = max(manifests, key=lambda m: m["created"])
        path = f"{root}/embeddings/{latest['version']}/vectors.parquet"
        word, vector, n = duckdb.connect().execute(
            "SELECT word, vector, (SELECT count(*) FROM read_parquet($path)) FROM read_parquet($path) "
            "WHERE word = 'the'", {"path": path}).fetchall()[0]
        ours = sorted(m for m in sys.modules if m.split(".")[0] in ("lexiflow", "prefect"))
        print(json.dumps({"version": latest["version"], "word": word, "vector": list(vector), "rows": n,
                          "imported": ours}))
    """)
    out = subprocess.run([sys.executable, "-I", "-c", script, box.config.store], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["imported"] == []
    catalog = Catalog(box.config.store)
    assert found["version"] == catalog.latest("embeddings")["version"]
    kv = load(catalog, "embeddings")
    assert found["rows"] == len(kv.index_to_key) and len(found["vector"]) == 20
    np.testing.assert_allclose(found["vector"], kv["the"], rtol=1e-6)


@pytest.mark.slow
def test_train_lm_deployment_runs_on_the_gpu_pool(box, runs):
    """Started by hand (the UI's Run with the form's defaults: the latest tokenized corpus)."""
    response = box.create_run("train-lm", {"store": box.config.store, "ngram": {"order": 2}})
    assert response.status_code == 201, response.text
    run = box.wait(response.json()["id"])
    assert run["state"]["type"] == "COMPLETED", box.logs_tail()
    assert run["work_pool_name"] == "gpu"
    catalog = Catalog(box.config.store)
    lm = catalog.latest("lm")
    assert lm["run"]["flow_run_id"] == run["id"]
    assert lm["inputs"]["tokens"]["version"] == catalog.latest("tokenized_corpus")["version"]
    assert lm["metrics"]["valid_perplexity"] > 1
    assert load(catalog, "lm").order == 2


@pytest.mark.slow
def test_lexiflow_run_uses_the_running_serve_and_lists_every_artifact(box, runs, monkeypatch, capsys):
    """While serve runs, `lexiflow run` from the same PREFECT_HOME reports to its server (the run shows in
    its UI) instead of starting a temporary one; here every stage is reused, and still each is listed."""
    from lexiflow.flows import server
    from lexiflow.flows.cli import main

    monkeypatch.setenv("PREFECT_HOME", str(box.home))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(server, "start_temporary", lambda *a, **k: pytest.fail("started a temporary server"))
    before = {r["id"] for r in box.flow_runs(deployment_id={"is_null_": True})}
    settings = [f"{section}.{name}={json.dumps(value)}" for section, values in SMALL.items() if isinstance(values, dict)
                for name, value in values.items()] + [f"{k}={json.dumps(v)}" for k, v in SMALL.items()
                                                      if not isinstance(v, dict)]
    assert main(["run", "--store", box.config.store, "--corpus", "builtin:lee",
                 *(x for s in settings for x in ("--set", s))]) == 0
    out, err = capsys.readouterr()
    assert "Using the Prefect server of `lexiflow serve`" in err
    new = [r for r in box.flow_runs(deployment_id={"is_null_": True}) if r["id"] not in before
           and r["flow_id"] == runs["pipeline"]["flow_id"]]
    assert len(new) == 1 and new[0]["state"]["type"] == "COMPLETED"
    listed = re.findall(r"^  (\S+) +([0-9a-f]{16})  ", out, re.M)
    assert {name for name, _ in listed} >= {"corpus", "tokenizer", "tokenized_corpus", "cooccurrence", "ppmi",
                                            "embeddings.svd", "embeddings.glove", "evaluation.svd", "report"}


def _piece_keys(store: str) -> dict[str, set[str]]:
    """The committed pieces in the store, by stage (storage/pieces.py: a piece is there once its piece.json is)."""
    return {stage: {p.parent.name for p in (Path(store) / PIECES / stage).glob(f"*/{COMMIT}")}
            for stage in ("corpus", "word_counts", "encoded", "ngrams")}


def _scheduled_rebuild(box: Box, parameters: dict) -> dict:
    """A corpus-rebuild run created as the scheduler creates one (Scheduled, due now), awaited."""
    now = dt.datetime.now(dt.UTC).isoformat()
    response = box.create_run("corpus-rebuild", parameters, state={
        "type": "SCHEDULED", "name": "Scheduled", "state_details": {"scheduled_time": now}})
    assert response.status_code == 201, response.text
    run = box.wait(response.json()["id"])
    assert run["state"]["type"] == "COMPLETED", f"{run['state']}\n{box.logs_tail()}"
    return run


@pytest.mark.slow
def test_corpus_rebuild_on_a_growing_folder_rebuilds_incrementally(box, tmp_path):
    """Issue 62's acceptance: two scheduled corpus-rebuild runs on a folder that grew by a file in between; the second
    reuses the pieces the first kept (per file for the corpus, per run of documents for the word counts, the
    encoding and the n-gram counts) and reads the new file. Pieces are on by the deployment's default alone.
    Last but one in the module: it releases new versions, which no test before it expects."""
    import textwrap as wrap

    from lexiflow.models.ingest.sources import gensim_data
    from lexiflow.storage import ArtifactStore
    from lexiflow.storage.pieces import read_uses

    # Lee's text hard-wrapped at 40 columns, a line a document (~9,600): enough documents for a few word-count runs
    # (a cut after 1 document in 4,096 on average, where the documents' hashes say: here 2 in the first 3 files)
    lines = [row for line in gensim_data("lee_background.cor").read_text().splitlines() for row in wrap.wrap(line, 40)]
    quarter = len(lines) // 4
    folder = tmp_path / "growing"
    folder.mkdir()

    def write(part: int) -> None:
        rows = lines[part * quarter:] if part == 3 else lines[part * quarter:(part + 1) * quarter]
        (folder / f"part{part}.txt").write_text("\n".join(rows) + "\n")

    for part in range(3):
        write(part)
    # SVD and the n-gram LM only (no GPU training); the corpus changes on purpose: its size and what depends on it
    # are reported, not blocking
    advisory = [*SMALL["checks"]["advisory"], "corpus.documents", "corpus.tokens",
                "tokenized_corpus.held_out_coverage", "lm.valid_word_perplexity"]
    parameters = {**SMALL, "embeddings": ["svd"], "lm": ["ngram"], "corpus": {"sources": [str(folder)]},
                  "checks": {"advisory": advisory}}  # no `parallel`: the deployment turns pieces on
    store = ArtifactStore(box.config.store)

    first = _scheduled_rebuild(box, parameters)
    assert first["parameters"]["parallel"] == {"pieces": True}  # the deployment's default, merged by the server
    corpus = Catalog(box.config.store).latest("corpus")
    assert corpus["run"]["flow_run_id"] == first["id"]
    kept = _piece_keys(box.config.store)
    made = read_uses(store, "corpus", corpus["version"])  # the pieces its corpus is made of: one per file
    assert len(set(made["corpus"])) == 3 and set(made["corpus"]) <= kept["corpus"], (made, kept)
    assert all(kept.values()), kept

    write(3)  # the folder grows by a quarter
    second = _scheduled_rebuild(box, parameters)
    catalog = Catalog(box.config.store)  # read afresh
    rebuilt = {kind: catalog.latest(kind) for kind in ("corpus", "tokenizer", "tokenized_corpus", "lm")}
    assert rebuilt["corpus"]["run"]["flow_run_id"] == second["id"]
    assert rebuilt["corpus"]["version"] != corpus["version"]
    assert rebuilt["lm"]["inputs"]["tokens"]["version"] == rebuilt["tokenized_corpus"]["version"]
    uses = {kind: read_uses(store, kind, manifest["version"]) for kind, manifest in rebuilt.items()}
    assert all(uses.values()), uses  # each was built from pieces
    # the corpus: the 3 files seen before replayed from their pieces, the new one read
    assert len(set(uses["corpus"]["corpus"])) == 4 and set(uses["corpus"]["corpus"]) > set(made["corpus"])
    # the runs of documents: those of the first run's documents found again, the ones the new file changed made
    for kind, stage in (("tokenizer", "word_counts"), ("tokenized_corpus", "encoded"), ("lm", "ngrams")):
        keys = uses[kind][stage]
        reused = [key for key in keys if key in kept[stage]]
        assert len(keys) > len(reused) >= len(keys) / 2, (kind, stage, keys, kept[stage])
    # and the run's log, in the UI, says so
    logs = box.logs(second["id"])
    assert any("corpus: 3 of 4 source parts" in line and "pieces, 1 computed" in line for line in logs), logs


@pytest.mark.slow
def test_stop_ends_everything_that_serve_started(box):
    processes = [serve.Started(**p) for p in box.state["processes"]]
    assert [p.name for p in processes] == ["server", "worker-cpu", "worker-gpu0"]
    lines = serve.stop(box.home, grace=10)
    assert len(lines) == 3 and all("stopped" in line for line in lines), lines
    assert not any(serve.is_running(p) for p in processes)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{box.state['api_url']}/health", timeout=5)
    assert not (box.home / serve.SERVE_STATE).exists()
    assert os.environ.get("PREFECT_API_URL") != box.state["api_url"]  # the test process was never repointed
