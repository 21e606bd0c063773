"""The pipeline through real Prefect (a temporary local server for the session)."""

import base64
import json
import time

import pytest
from lexiflow.flows.cli import main
from lexiflow.flows.params import PipelineParams, validate
from lexiflow.flows.pipeline import run_pipeline
from lexiflow.loaders import load
from lexiflow.storage import ArtifactStore, Catalog
from lexiflow.tasks.report import figure_key
from lexiflow.tasks.stage import stage
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.testing.utilities import prefect_test_harness
from pydantic import BaseModel

pytestmark = pytest.mark.prefect
SMALL = {"corpus": {"sources": ["builtin:lee"]}, "vocabulary": {"min_count": 3}, "svd": {"dim": 40},
         "embeddings": ["svd"], "lm": [], "evaluation": {"analogy_vocabulary": 2000, "projection_words": 0}}


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def small_params(store, **overrides) -> PipelineParams:
    tree = json.loads(json.dumps(SMALL))
    for section, values in overrides.items():
        tree.setdefault(section, {}).update(values)
    return validate({"store": str(store), **tree})


def created(store):
    return {(m["kind"], m["version"]): m["created"] for m in Catalog(store).list()}


def test_caching_reuses_unchanged_stages_and_recomputes_deleted_ones(tmp_path):
    store = tmp_path / "store"
    first = run_pipeline(small_params(store))
    assert set(Catalog(store).kinds()) == {"corpus", "tokenizer", "tokenized_corpus", "cooccurrence", "ppmi",
                                           "embeddings", "evaluation", "checks", "report"}
    before = created(store)

    # A second run recomputes nothing.
    assert run_pipeline(small_params(store)) == first
    assert created(store) == before

    # Changing only the SVD dimension recomputes SVD and evaluation only (and the run's checks and report).
    changed = run_pipeline(small_params(store, svd={"dim": 30}))
    new = set(created(store)) - set(before)
    assert sorted(kind for kind, _ in new) == ["checks", "embeddings", "evaluation", "report"]
    assert all(changed[k] == first[k] for k in ("corpus", "tokenizer", "tokenized_corpus", "cooccurrence", "ppmi"))

    # A deleted artifact is rebuilt, not returned as a dangling (cached) reference.
    ppmi = first["ppmi"]
    ArtifactStore(store).delete("ppmi", ppmi.version)
    again = run_pipeline(small_params(store))
    assert again == first
    assert ArtifactStore(store).verify("ppmi", ppmi.version, full=True) == []
    after = created(store)
    assert after[("ppmi", ppmi.version)] != before[("ppmi", ppmi.version)]
    svd_key = ("embeddings", first["embeddings.svd"].version)
    assert after[svd_key] == before[svd_key]

    # The evaluation artifact carries the headline metrics and a report; embeddings load in gensim.
    metrics = ArtifactStore(store).manifest("evaluation", first["evaluation.svd"].version)["metrics"]
    for key in ("ws353_spearman", "simlex999_spearman", "analogy_add_accuracy", "analogy_mul_accuracy",
                "analogy_coverage"):
        assert key in metrics
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load_word2vec_format(f"{first['embeddings.svd'].path}/vectors.bin", binary=True)
    kv_text = KeyedVectors.load_word2vec_format(f"{first['embeddings.svd'].path}/vectors.txt")
    assert kv.vector_size == 40 and kv.index_to_key == kv_text.index_to_key
    assert kv.index_to_key[0] == "the"


def test_cli_run_and_listing(tmp_path, capsys):
    store = tmp_path / "store"
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(f"The cat number {i} sat on the mat. A dog {i % 7} barked at the cat."
                                for i in range(300)))
    code = main(["run", "--store", str(store), "--corpus", str(corpus), "--set", "vocabulary.min_count=1",
                 "--set", "svd.dim=5", "--set", "evaluation.analogy_vocabulary=100", "--set", 'embeddings=["svd"]',
                 "--set", "lm=[]", "--set", "evaluation.projection_words=0"])
    out = capsys.readouterr().out
    assert code == 0 and "Evaluation report:" in out and "ws353_spearman" in out
    assert main(["artifacts", "list", "--store", str(store), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert len(listing) == 9  # the run's checks too
    assert set(listing[0]) == {"kind", "version", "created", "inputs", "parameters", "metrics", "path", "aliases"}
    emb = next(a for a in listing if a["kind"] == "embeddings")
    assert emb["parameters"]["params"]["dim"] == 5 and set(emb["inputs"]) == {"ppmi"}
    assert main(["artifacts", "show", "embeddings", "--store", str(store)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lineage"]["inputs"]["ppmi"]["inputs"]["cooccurrence"]["kind"] == "cooccurrence"
    assert main(["artifacts", "verify", "--store", str(store), "--full"]) == 0


def test_a_rerun_that_finds_every_artifact_prints_the_same_summary_without_starting_prefect(tmp_path, capsys,
                                                                                          monkeypatch):
    from lexiflow.flows import server
    from prefect.settings import PREFECT_API_URL, temporary_settings

    store = tmp_path / "store"
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(f"The cat number {i} sat on the mat. A dog {i % 7} barked." for i in range(200)))
    command = ["run", "--store", str(store), "--corpus", str(corpus), "--set", "vocabulary.min_count=1",
               "--set", "svd.dim=5", "--set", 'embeddings=["svd"]', "--set", "lm=[\"ngram\"]",
               "--set", "evaluation.analogy_vocabulary=100", "--set", "evaluation.projection_words=0"]
    assert main(command) == 0  # cold, through the session's server
    cold = capsys.readouterr().out
    before = created(store)

    def no_server(*_args, **_kwargs):
        raise server.ServerError("the temporary Prefect server cannot start in this test")

    monkeypatch.setattr(server, "start_temporary", no_server)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))  # no `lexiflow serve` there
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # no server of the user's either
        assert main(command) == 0
        assert capsys.readouterr().out == cold and "lm.ngram" in cold
        assert created(store) == before  # nothing rebuilt, nothing written
        # one artifact missing: the stage must run, so Prefect must start (and here cannot)
        ArtifactStore(store).delete("report", Catalog(store).get("report")["version"])
        assert main(command) == 2
        assert "cannot start in this test" in capsys.readouterr().err
        assert set(created(store)) == {key for key in before if key[0] != "report"}  # and the lookup wrote nothing


@pytest.mark.parametrize("content, message", [
    (b"fine line\nbad \xff byte\n", "bad.txt:2: invalid UTF-8"),
    (b"\x00\x00binary", "bad.txt: looks like a binary file"),
])
def test_bad_input_fails_fast_with_one_line_and_no_artifact(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    store = tmp_path / "store"
    assert main(["run", "--store", str(store), "--corpus", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
    assert Catalog(store).list() == []
    assert not any(p for p in (store / ".staging").glob("*")) if (store / ".staging").exists() else True


def test_a_corpus_without_a_train_split_stops_at_the_tokenizer_and_says_why(tmp_path, capsys, shared_data):
    """A file named after a split goes whole into it (wiki.valid.tokens): with no train text the run
    stops before the tokenizer with a message naming the cause, and builds nothing past the corpus."""
    held_out = tmp_path / "wiki.valid.tokens"
    held_out.write_text("\n".join((shared_data / "wikitext-2" / "wiki.valid.tokens").read_text().splitlines()[:300]))
    store = tmp_path / "store"
    assert main(["run", "--store", str(store), "--corpus", str(held_out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: corpus ") and "has no train split (held out: " in err and "valid)" in err
    assert "wiki.valid.tokens" in err and "a name without a split word" in err
    assert sorted(a["kind"] for a in Catalog(store).list()) == ["corpus"]


def test_parameters_are_validated_before_any_work(tmp_path, capsys):
    assert main(["run", "--store", str(tmp_path), "--set", "svd.dims=3"]) == 2
    assert "svd.dims: Extra inputs are not permitted" in capsys.readouterr().err
    assert main(["run", "--store", str(tmp_path), "--set", "svd.dim=1"]) == 2
    assert "svd.dim: Input should be greater than or equal to 2" in capsys.readouterr().err
    assert main(["run", "--store", str(tmp_path), "--corpus", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt: no such file or directory" in capsys.readouterr().err
    assert main(["run", "--store", str(tmp_path), "--set", "store.x=1"]) == 2
    assert "'store' is a value, not a section" in capsys.readouterr().err
    assert Catalog(tmp_path).list() == []


def _ewt_slice(src, dst, sentences):
    """The first `sentences` sentences of a CoNLL-U file (name keeps its split: *-train/-dev/-test)."""
    blocks = src.read_text(encoding="utf-8").split("\n\n")[:sentences]
    dst.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    return dst


@pytest.mark.slow
def test_all_stages_on_a_small_treebank(tmp_path, shared_data, capsys):
    """CoNLL-U sources give a tagged corpus and taggers; subword tokens feed the language models."""
    ewt = shared_data / "ud-english-ewt"
    data = tmp_path / "ewt"
    data.mkdir()
    for split, n in (("train", 1500), ("dev", 200), ("test", 200)):
        _ewt_slice(ewt / f"en_ewt-ud-{split}.conllu", data / f"en_ewt-ud-{split}.conllu", n)
    store = tmp_path / "store"
    params = validate({
        "store": str(store), "corpus": {"sources": [str(data)]}, "vocabulary": {"min_count": 2},
        "svd": {"dim": 20}, "evaluation": {"analogy_vocabulary": 1000},
        "tokenizer": {"kind": "bpe", "vocab_size": 400}, "lm": ["ngram", "gru"],
        "embeddings": ["svd", "lsi", "sgns", "cbow", "glove"], "word2vec": {"epochs": 1, "dim": 16},
        "lsi": {"dim": 20}, "ppmi": {"counts": "termdoc", "alpha": 1.0, "log_base": 2},
        "glove": {"epochs": 2, "dim": 16},
        "neural": {"emb_dim": 16, "hidden_dim": 16, "num_layers": 1, "epochs": 1, "max_steps": 30,
                   "batch_size": 8, "bptt": 16, "device": "cpu"},
        "tagger": {"columns": ["upos", "xpos"]},
    })
    refs = run_pipeline(params)
    store_obj = ArtifactStore(store)
    tagger = store_obj.manifest("tagger", refs["tagger.upos"].version)["metrics"]
    assert tagger["evaluated_on"] == "test" and tagger["tokens"] > 2000
    assert tagger["accuracy"] > 0.8 > tagger["unknown_accuracy"] - 0.3  # small training set, still a tagger
    for model in ("ngram", "gru"):
        metrics = store_obj.manifest("lm", refs[f"lm.{model}"].version)["metrics"]
        assert 1 < metrics["test_perplexity"] < metrics["vocabulary_size"], (model, metrics)
        assert store_obj.manifest("lm", refs[f"lm.{model}"].version)["inputs"]["tokenizer"]["version"] != \
            refs["tokenizer"].version  # subword tokens, not the word vocabulary
    report = (store / "report" / refs["report"].version / "report.md").read_text()
    assert "## Language models" in report and "\n## UPOS HMM tagger" in report and "\n## XPOS HMM tagger" in report
    for column in ("upos", "xpos"):  # each tagger's own heatmap, under its own name
        png = (store / "report" / refs["report"].version / f"tagger-{column}-confusion.png").read_bytes()
        assert png == (store / "tagger" / refs[f"tagger.{column}"].version / "confusion.png").read_bytes()
    assert "| lsi |" in report and "| svd |" in report  # count-based methods side by side
    for method in ("sgns", "cbow", "glove"):
        emb = store_obj.manifest("embeddings", refs[f"embeddings.{method}"].version)
        assert emb["metrics"]["method"] == method and any(f["name"] == "loss_curve.png" for f in emb["files"])
        assert emb["metrics"]["words_per_s"] > 0  # one speed unit for every trained method
        assert f"| {method} |" in report and f"![{method}-loss_curve.png]({method}-loss_curve.png)" in report
    figures = sorted(p.name for p in (store / "report" / refs["report"].version).glob("*.png"))
    assert figures == ["cbow-loss_curve.png", "cbow-projection.png", "glove-loss_curve.png", "glove-projection.png",
                       "lm-gru-loss_curve.png", "lsi-projection.png", "sgns-loss_curve.png", "sgns-projection.png",
                       "svd-projection.png",
                       "tagger-upos-confusion.png", "tagger-xpos-confusion.png"]
    # In the Prefect UI each figure is an image artifact carrying the PNG, and the markdown names it
    # instead of linking a file the browser cannot reach.
    run_id = store_obj.manifest("report", refs["report"].version)["run"]["flow_run_id"]
    with get_client(sync_client=True) as client:
        shown = {a.key: a for a in client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]),
            key=ArtifactFilterKey(any_=[figure_key(name) for name in figures] + ["evaluation-report"])))}
    for name in figures:
        png = (store / "report" / refs["report"].version / name).read_bytes()
        assert shown[figure_key(name)].data == "data:image/png;base64," + base64.b64encode(png).decode()
    ui_report = shown["evaluation-report"].data
    assert ".png)" not in ui_report and "image artifact `report-glove-loss-curve`" in ui_report

    # lexiflow generate continues a prompt with either LM and its (BPE) tokenizer; greedy is deterministic.
    capsys.readouterr()
    for model in ("ngram", "gru"):
        args = ["generate", "--store", str(store), "--lm", refs[f"lm.{model}"].version, "--prompt", "the",
                "--max-tokens", "6"]
        assert main(args) == 0
        first = capsys.readouterr().out.strip()
        assert main(args) == 0 and capsys.readouterr().out.strip() == first
        assert first.startswith("the") and len(first) > len("the")

    # lexiflow tag writes predicted UPOS into a CoNLL-U file; XPOS, which this tagger does not predict,
    # becomes _ (never the file's gold tags beside predicted ones); every other column stays as it was.
    source = data / "en_ewt-ud-dev.conllu"
    out = tmp_path / "tagged.conllu"
    upos = refs["tagger.upos"].version
    assert main(["tag", str(source), "-o", str(out), "--store", str(store), "--tagger", upos]) == 0
    before, after = source.read_text().splitlines(), out.read_text().splitlines()
    assert len(before) == len(after)
    changed_columns = {i for b, a in zip(before, after, strict=True) if b != a
                       for i, (x, y) in enumerate(zip(b.split("\t"), a.split("\t"), strict=True)) if x != y}
    assert changed_columns == {3, 4}
    tokens = [(b.split("\t"), a.split("\t")) for b, a in zip(before, after, strict=True) if b.split("\t")[0].isdigit()]
    assert all(a[4] == "_" for _, a in tokens)
    assert sum(b[3] == a[3] for b, a in tokens) / len(tokens) > 0.8  # predicted UPOS against the gold


@pytest.mark.slow
def test_neural_taggers_beside_the_hmm_in_the_pipeline_report_and_the_tag_command(tmp_path, shared_data):
    """tagger.kinds trains the HMM, the BiLSTM and the BiLSTM+ELMo (after an `elmo` biLM on the corpus); the
    report compares them and shows the learned ELMo layer weights; `lexiflow tag` takes any kind."""
    ewt = shared_data / "ud-english-ewt"
    data = tmp_path / "ewt"
    data.mkdir()
    for split, n in (("train", 300), ("dev", 40), ("test", 40)):
        _ewt_slice(ewt / f"en_ewt-ud-{split}.conllu", data / f"en_ewt-ud-{split}.conllu", n)
    store = tmp_path / "store"
    refs = run_pipeline(small_params(
        store, corpus={"sources": [str(data)], "lowercase": False}, vocabulary={"min_count": 1},
        svd={"dim": 10}, evaluation={"analogy_vocabulary": 200},
        tagger={"columns": ["upos"], "kinds": ["hmm", "bilstm", "bilstm+elmo"], "hidden_dim": 8, "epochs": 2,
                "device": "cpu", "pretrained": "svd"},
        elmo={"dim": 8, "hidden_dim": 16, "max_vocab": 200, "device": "cpu"}))
    assert {"tagger.upos", "tagger.bilstm.upos", "tagger.bilstm+elmo.upos", "elmo"} <= set(refs)
    store_obj = ArtifactStore(store)
    elmo_tagger = store_obj.manifest("tagger", refs["tagger.bilstm+elmo.upos"].version)
    assert elmo_tagger["inputs"]["elmo"]["version"] == refs["elmo"].version
    # tagger.pretrained=svd: the BiLSTMs' word embeddings start from the run's SVD vectors (the HMM has none)
    for name in ("tagger.bilstm.upos", "tagger.bilstm+elmo.upos"):
        inputs = store_obj.manifest("tagger", refs[name].version)["inputs"]
        assert inputs["vectors"]["version"] == refs["embeddings.svd"].version
    assert "vectors" not in store_obj.manifest("tagger", refs["tagger.upos"].version)["inputs"]
    from lexiflow.loaders import load

    bilstm = load(store, "tagger", refs["tagger.bilstm.upos"].version)
    assert bilstm.module_.embedding.weight.shape[1] == 10  # the width of the SVD vectors (svd.dim)
    weights = elmo_tagger["metrics"]["elmo_weights"]
    assert len(weights) == 3 and sum(weights) == pytest.approx(1.0)
    assert store_obj.manifest("elmo", refs["elmo"].version)["metrics"]["lowercase"] is False
    report = (store / "report" / refs["report"].version / "report.md").read_text()
    table = report[report.index("## Taggers"):]
    for model in ("| hmm |", "| bilstm |", "| bilstm+elmo |"):
        assert model in table
    assert " / ".join(f"{w:.2f}" for w in weights) in table
    assert "\n## UPOS BiLSTM+ELMo tagger" in report and "Learned ELMo layer weights" in report
    for name in ("tagger-upos-confusion.png", "tagger-bilstm-upos-confusion.png",
                 "tagger-bilstm-elmo-upos-confusion.png"):
        assert (store / "report" / refs["report"].version / name).exists()

    # lexiflow tag with a neural tagger: the CoNLL-U file's UPOS column is what the loaded tagger predicts.
    source, out = data / "en_ewt-ud-dev.conllu", tmp_path / "tagged.conllu"
    version = refs["tagger.bilstm+elmo.upos"].version
    assert main(["tag", str(source), "-o", str(out), "--store", str(store), "--tagger", version]) == 0
    from lexiflow.models.conllu import read_conllu

    tagger = load(store, "tagger", version)
    expected = tagger.tag_many([s.words for s in read_conllu(source)])
    assert [s.upos for s in read_conllu(out)] == expected


class ProbeParams(BaseModel):
    text: str = "built once"


PROBE_BUILDS: list[str] = []


@stage("probe")
def build_probe(out, params: ProbeParams) -> None:
    PROBE_BUILDS.append(params.text)
    time.sleep(1.0)  # long enough for the other run to ask for the same version meanwhile
    out.write_text("probe.txt", params.text)


def test_two_runs_asking_for_one_version_at_once_build_it_once(tmp_path):
    """Two runs of one version on one machine (a schedule and a manual trigger): the second waits
    for the first and reuses its artifact instead of computing it again beside it."""

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def two_runs(store: str):
        futures = [build_probe.submit(store, params=ProbeParams()) for _ in range(2)]
        return [future.result() for future in futures]

    store = tmp_path / "store"
    first, second = two_runs(str(store))
    assert first == second and PROBE_BUILDS == ["built once"]
    assert ArtifactStore(store).read_text("probe", first.version, "probe.txt") == "built once"
    assert not list((store / ".scratch").glob("*.lock"))


@pytest.mark.slow
def test_damaged_artifacts_are_rebuilt_or_refused_through_the_pipeline(tmp_path, capsys):
    """A deleted data file of a reused artifact is found by the reuse check and rebuilt; a flipped bit in
    a reused Parquet table (same size) is found by its page checksum when a stage reads it: one line
    naming the artifact and the repair, which then works (docs/reliability.md, "Damage and repair")."""
    from pathlib import Path

    from lexiflow.storage.manifests import ArtifactDamaged

    store = tmp_path / "store"
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(f"The cat number {i} sat on the mat. A dog {i % 7} barked at the cat."
                                for i in range(300)))
    run = ["run", "--store", str(store), "--corpus", str(corpus), "--set", "vocabulary.min_count=1",
           "--set", "evaluation.analogy_vocabulary=100", "--set", 'embeddings=["svd"]', "--set", "lm=[]",
           "--set", "evaluation.projection_words=0"]
    assert main([*run, "--set", "svd.dim=5"]) == 0
    ppmi = Catalog(store).latest("ppmi")
    matrix = Path(ppmi["path"]) / "matrix.parquet"
    before = created(store)
    matrix.unlink()
    assert main([*run, "--set", "svd.dim=5"]) == 0
    rebuilt = {key for key, when in created(store).items() if when != before.get(key)}
    assert rebuilt == {("ppmi", ppmi["version"])} and matrix.exists()  # every other stage reused
    assert Catalog(store).audit(full=True)[1] == []

    data = bytearray(matrix.read_bytes())
    data[len(data) // 3] ^= 0x01
    matrix.write_bytes(bytes(data))
    with pytest.raises(ArtifactDamaged):
        load(store, "ppmi")
    assert main([*run, "--set", "svd.dim=4"]) == 2  # the new SVD reads the damaged matrix
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: ppmi:{ppmi['version']}/matrix.parquet: damaged (")
    assert errors[0].endswith(f"remove it with `lexiflow artifacts rm ppmi:{ppmi['version']} --force` and run "
                              "again to rebuild it")
    assert main(["artifacts", "rm", f"ppmi:{ppmi['version']}", "--force", "--store", str(store)]) == 0
    assert main([*run, "--set", "svd.dim=4"]) == 0
    assert Catalog(store).audit(full=True)[1] == []
