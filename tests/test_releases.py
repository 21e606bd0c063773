"""Release aliases and their log, on every backend (a local folder, and S3 served by moto on loopback:
tests/backends.py): an alias names a version, each move is one log entry created exclusively, rollback
replays the log, concurrent movers lose no entry, and `gc`/`rm` keep what an alias names."""

import json
import subprocess
import sys
import threading

import polars as pl
import pytest
from lexiflow.flows.cli import main
from lexiflow.loaders import load
from lexiflow.storage import ArtifactStore, Catalog, StoreError
from lexiflow.storage.catalog import split_alias

from tests.test_cli import (  # noqa: F401  (quiet_logs: a fixture)
    UPOS,
    UPOS_TAGGER,
    XPOS,
    XPOS_TAGGER,
    ngram_store,
    publish_tagger,
    quiet_logs,
    token_rows,
)
from tests.test_store import V1, V2, V3, files, publish, put

V4 = "00000000000000bb"


def one_error_line(capsys) -> str:
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), out.err
    return err[0].removeprefix("error: ")


def test_release_names_a_version_and_logs_each_move(store_url):
    store = ArtifactStore(store_url)
    for version in (V1, V2):
        publish(store, "corpus", version)
    catalog = Catalog(store_url)
    assert catalog.released("corpus") is None and catalog.aliases() == {} and catalog.release_log("corpus") == []

    first = catalog.release("corpus", V1)
    assert {k: first[k] for k in ("kind", "alias", "seq", "action", "from", "to", "reason", "flow_run")} == {
        "kind": "corpus", "alias": "production", "seq": 1, "action": "release", "from": None, "to": V1,
        "reason": "", "flow_run": None}
    second = catalog.release("corpus", V2, reason="better coverage", flow_run="a1b2")
    assert (second["seq"], second["from"], second["to"], second["reason"], second["flow_run"]) == (
        2, V1, V2, "better coverage", "a1b2")
    assert catalog.release("corpus", V2) == {**second, "unchanged": True}  # already there: nothing written
    catalog.release("corpus", V1, "staging")

    other = Catalog(store_url)  # another reader sees the moves (no cached listing)
    assert other.released("corpus") == V2 and other.released("corpus", "staging") == V1
    assert other.aliases() == {"corpus": {"production": V2, "staging": V1}}
    assert other.aliases("tokenizer") == {}
    assert [(e["alias"], e["seq"], e["to"]) for e in other.release_log("corpus")] == [
        ("production", 1, V1), ("production", 2, V2), ("staging", 1, V1)]
    assert other.release_log("corpus", "production") == [first, second]
    assert other.get("corpus@production")["version"] == V2
    assert other.get("corpus", "corpus@staging")["version"] == V1
    assert other.ref("corpus@production") == store.ref("corpus", V2)
    # The layout docs/artifacts.md describes: one immutable entry per move, the alias its last entry, and each
    # entry's head record.
    aliases = [f for f in files(store) if f.startswith(".aliases/")]
    assert aliases == [f".aliases/corpus/{name}" for name in ("production/00000001.head", "production/00000001.json",
                       "production/00000002.head", "production/00000002.json", "staging/00000001.head",
                       "staging/00000001.json")]
    with store.fs.open(f"{store.root}/.aliases/corpus/production/00000002.json") as f:
        assert json.load(f) == second


def test_rollback_moves_back_one_release_at_a_time(store_url):
    store = ArtifactStore(store_url)
    for version in (V1, V2, V3):
        publish(store, "corpus", version)
    catalog = Catalog(store_url)
    for version in (V1, V2, V3):
        catalog.release("corpus", version)
    back = catalog.rollback("corpus", reason="bad corpus")
    assert (back["action"], back["from"], back["to"], back["reason"]) == ("rollback", V3, V2, "bad corpus")
    assert catalog.rollback("corpus")["to"] == V1  # back again: the release before, not V3
    with pytest.raises(StoreError, match=f"names {V1}, its first release: no earlier version"):
        catalog.rollback("corpus")
    catalog.release("corpus", V3)
    assert catalog.rollback("corpus")["to"] == V1
    log = catalog.release_log("corpus")
    assert [e["to"] for e in log] == [V1, V2, V3, V2, V1, V3, V1]
    assert all(e["from"] == before["to"] for before, e in zip(log, log[1:], strict=False))
    with pytest.raises(StoreError, match="no alias 'staging' for corpus .*nothing to roll back"):
        catalog.rollback("corpus", "staging")


def test_malformed_and_unknown_aliases_are_one_line_errors_saying_what_to_do(store_url, capsys):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V1)
    catalog = Catalog(store_url)
    assert split_alias("corpus@production") == ("corpus", "production") and split_alias("corpus") == ("corpus", None)
    for spec in ("corpus@", "@production", "corpus@Prod", "corpus@a@b", "Corpus@production"):
        with pytest.raises(StoreError, match="is not an alias reference: write KIND@NAME"):
            catalog.get(spec)
    with pytest.raises(StoreError, match=f"no alias 'production' for corpus in {store_url}; release a version first: "
                                         "lexiflow release corpus:VERSION$"):
        catalog.get("corpus@production")
    catalog.release("corpus", V1)
    with pytest.raises(StoreError, match="corpus@production names a corpus artifact where a tokenizer one is wanted"):
        catalog.get("tokenizer", "corpus@production")
    with pytest.raises(StoreError, match="invalid alias name 'Prod'"):
        catalog.release("corpus", V1, "Prod")
    with pytest.raises(StoreError, match=f"no artifact corpus:{V2} in .*artifacts list --kind corpus"):
        catalog.release("corpus", V2)
    publish(store, "corpus", V2)
    put(store, store.path("corpus", V2, "config.json"), b"{}")  # shorter than the manifest says
    with pytest.raises(StoreError, match=f"not released: corpus:{V2}/config.json: size differs .*rm corpus:{V2} "
                                         "--force"):
        catalog.release("corpus", V2)
    assert catalog.released("corpus") == V1

    assert main(["artifacts", "show", "corpus@staging", "--store", store_url]) == 2
    assert one_error_line(capsys) == (f"no alias 'staging' for corpus in {store_url}; release a version first: "
                                      "lexiflow release corpus:VERSION --as staging")
    assert main(["artifacts", "show", "corpus@", "--store", store_url]) == 2
    assert one_error_line(capsys).startswith("'corpus@' is not an alias reference: write KIND@NAME")
    # A released version removed with --force: the alias says so, and how to mend it.
    assert main(["artifacts", "rm", f"corpus:{V1}", "--force", "--store", store_url]) == 0
    capsys.readouterr()
    assert main(["artifacts", "export", "corpus@production", "out", "--store", store_url]) == 2
    assert one_error_line(capsys) == (f"corpus@production names corpus:{V1}, which is no longer in {store_url} "
                                      "(removed); release another version: lexiflow release corpus:VERSION")


class PausedCatalog(Catalog):
    """A catalog whose first read of a release log waits at a barrier: two movers built on it both read the
    same log before either writes, so both try the same sequence number (no reliance on timing)."""

    def __init__(self, url, barrier):
        super().__init__(url)
        self.barrier, self.reads = barrier, 0

    def release_log(self, kind, alias=None, **options):
        entries = super().release_log(kind, alias, **options)
        self.reads += 1
        if self.reads == 1:
            self.barrier.wait(timeout=60)
        return entries


def run_threads(*targets):
    errors = []

    def guarded(target):
        try:
            target()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_two_releases_that_read_the_same_log_both_land_in_order(store_url):
    store = ArtifactStore(store_url)
    for version in (V1, V2, V3):
        publish(store, "corpus", version)
    Catalog(store_url).release("corpus", V3)
    barrier = threading.Barrier(2)
    movers = [PausedCatalog(store_url, barrier) for _ in range(2)]
    run_threads(lambda: movers[0].release("corpus", V1, reason="one"),
                lambda: movers[1].release("corpus", V2, reason="two"))
    assert sorted(m.reads for m in movers) == [1, 2]  # one lost the race for entry 2 and read the log again
    log = Catalog(store_url).release_log("corpus")
    assert [e["seq"] for e in log] == [1, 2, 3] and {e["to"] for e in log[1:]} == {V1, V2}
    assert log[1]["from"] == V3 and log[2]["from"] == log[1]["to"]  # the loser appended after the winner
    assert Catalog(store_url).released("corpus") == log[-1]["to"]


def test_a_rollback_that_loses_the_race_rolls_back_nothing(store_url):
    """Rolling back means undoing the version one saw: when another release lands first, nothing moves."""
    store = ArtifactStore(store_url)
    for version in (V1, V2, V3):
        publish(store, "corpus", version)
    for version in (V1, V2):
        Catalog(store_url).release("corpus", version)
    barrier = threading.Barrier(2)
    movers = [PausedCatalog(store_url, barrier) for _ in range(2)]
    outcome = {}

    def roll_back():
        try:
            outcome["rollback"] = movers[1].rollback("corpus")
        except StoreError as exc:
            outcome["refused"] = str(exc)

    run_threads(lambda: movers[0].release("corpus", V3), roll_back)
    log = Catalog(store_url).release_log("corpus")
    if "refused" in outcome:  # the release took entry 3 first
        assert [e["to"] for e in log] == [V1, V2, V3] and f"moved to {V3} while rolling back {V2}" in outcome["refused"]
    else:  # the rollback took entry 3 first; the release then appended after it
        assert [e["to"] for e in log] == [V1, V2, V1, V3] and outcome["rollback"]["to"] == V1


def test_many_concurrent_movers_leave_one_chain_with_every_move(store_url):
    store = ArtifactStore(store_url)
    versions = [f"{i:016x}" for i in range(1, 9)]
    for version in versions:
        publish(store, "corpus", version, rows=1)
    rounds = 3

    def mover(pair):
        catalog = Catalog(store_url)
        for i in range(rounds):  # its two versions in turn: every release is a move
            catalog.release("corpus", pair[i % 2], reason=pair[0])

    run_threads(*[lambda pair=versions[i:i + 2]: mover(pair) for i in range(0, 8, 2)])
    log = Catalog(store_url).release_log("corpus")
    assert [e["seq"] for e in log] == list(range(1, 4 * rounds + 1))  # no entry lost, none twice
    assert log[0]["from"] is None and all(e["from"] == before["to"] for before, e in zip(log, log[1:], strict=False))
    assert Catalog(store_url).released("corpus") == log[-1]["to"]
    assert sorted(e["reason"] for e in log) == sorted([v for v in versions[::2] for _ in range(rounds)])


MOVER = """
import json, sys
from lexiflow.storage import Catalog
from lexiflow.storage.files import register_storage_options
register_storage_options(sys.argv[1], json.loads(sys.argv[2]) or None)
catalog, versions = Catalog(sys.argv[1]), sys.argv[3:]
print("ready", flush=True)
sys.stdin.readline()  # the start gate: every mover is loaded before any moves
for i in range({rounds}):
    catalog.release("corpus", versions[i % 2], reason=versions[0])
"""


def test_movers_in_separate_processes_leave_one_chain_with_every_move(store_url):
    """Separate processes (their own storage clients), started together through a gate."""
    store = ArtifactStore(store_url)
    versions = [f"{i:016x}" for i in range(1, 7)]
    for version in versions:
        publish(store, "corpus", version, rows=1)
    options, rounds = json.dumps(store.fs.storage_options if not store.is_local else {}), 4
    movers = [subprocess.Popen([sys.executable, "-c", MOVER.format(rounds=rounds), store_url, options, *pair],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for pair in (versions[0:2], versions[2:4], versions[4:6])]
    assert [m.stdout.readline().strip() for m in movers] == ["ready"] * 3
    for m in movers:
        m.stdin.write("go\n")
        m.stdin.close()
    assert [m.wait(timeout=300) for m in movers] == [0, 0, 0]
    log = Catalog(store_url).release_log("corpus")
    assert [e["seq"] for e in log] == list(range(1, 3 * rounds + 1))
    assert log[0]["from"] is None and all(e["from"] == before["to"] for before, e in zip(log, log[1:], strict=False))
    assert Catalog(store_url).released("corpus") == log[-1]["to"]
    assert sorted(e["reason"] for e in log) == sorted([v for v in versions[::2] for _ in range(rounds)])


def test_an_exclusive_create_never_replaces_a_file(store_url):
    store = ArtifactStore(store_url)
    path = f"{store.root}/.aliases/corpus/production/00000001.json"
    assert store.create_file(path, b"first") is True
    assert store.create_file(path, b"second") is False
    assert store.create_file(path, b"first") is (not store.is_local)  # a retried upload finds its own bytes
    with store.fs.open(path, "rb") as f:
        assert f.read() == b"first"
    assert [f for f in files(store) if not f.startswith(".aliases/")] == []  # no temporary file stays


def test_loaders_and_training_inputs_read_what_an_alias_names(store_url):
    from lexiflow.flows.params import artifact_ref
    from lexiflow.models.errors import ParameterError

    store = ArtifactStore(store_url)
    for version, text in ((V1, "one"), (V2, "two")):
        with store.writer("corpus", version) as out:
            out.write_parquet("documents.parquet", pl.DataFrame({"doc_id": [version], "text": [text]}))
    Catalog(store_url).release("corpus", V1)
    assert load(store_url, "corpus")["text"].to_list() == ["two"]  # the latest
    assert load(store_url, "corpus@production")["text"].to_list() == ["one"]
    assert load(Catalog(store_url), "corpus", "corpus@production")["text"].to_list() == ["one"]
    assert artifact_ref(store_url, "inputs.corpus", "corpus", "corpus@production") == store.ref("corpus", V1)
    with pytest.raises(ParameterError, match="inputs.corpus: no alias 'staging' for corpus"):
        artifact_ref(store_url, "inputs.corpus", "corpus", "corpus@staging")


def lineage(store):
    """corpus V1 → tokenizer V2 → report V3 (older), corpus V1 → tokenizer V4 → report "...cc" (newer)."""
    import time

    corpus = publish(store, "corpus", V1)
    old = publish(store, "report", V3, inputs={"tokenizer": publish(store, "tokenizer", V2, inputs={"corpus": corpus})})
    time.sleep(0.01)  # `created` orders them
    new = publish(store, "report", "00000000000000cc", inputs={"tokenizer": publish(store, "tokenizer", V4,
                                                                                       inputs={"corpus": corpus})})
    return old, new


def test_gc_keeps_released_versions_and_their_lineage(store_url, capsys):
    store = ArtifactStore(store_url)
    old, new = lineage(store)
    catalog = Catalog(store_url)
    assert catalog.unreferenced(1) == [("report", V3), ("tokenizer", V2)]
    catalog.release("report", V3)
    assert catalog.unreferenced(1) == []  # the released report and its tokenizer stay
    catalog.release("report", new.version)
    assert catalog.unreferenced(1) == []  # the one a rollback returns to stays too
    catalog.release("tokenizer", V4, "staging")
    catalog.release("report", V3, "staging")
    catalog.release("report", new.version, "staging")  # staging: V3 then the newer one
    catalog.rollback("report")  # production back to V3: history [V3]
    catalog.release("report", new.version)  # history [V3, new]
    assert catalog.protected() == {("report", V3), ("report", new.version), ("tokenizer", V4)}
    assert main(["artifacts", "gc", "--keep", "1", "--store", store_url]) == 0
    assert all(store.exists(*key) for key in [("report", V3), ("tokenizer", V2), ("corpus", V1)])


def test_rm_refuses_a_released_version_unless_forced(store_url, capsys):
    store = ArtifactStore(store_url)
    publish(store, "corpus", V1)
    Catalog(store_url).release("corpus", V1, "staging")
    assert main(["artifacts", "rm", f"corpus:{V1}", "--store", store_url]) == 2
    assert one_error_line(capsys) == (f"corpus:{V1} is released as corpus@staging; release another version first, "
                                      "or add --force (the alias then names a missing artifact)")
    assert store.exists("corpus", V1)
    assert main(["artifacts", "rm", f"corpus:{V1}", "--force", "--store", store_url]) == 0
    assert not store.exists("corpus", V1)


def test_release_command_moves_rolls_back_and_lists_aliases(store_url, capsys):
    store = ArtifactStore(store_url)
    for version in (V1, V2):
        publish(store, "corpus", version)
    assert main(["release", f"corpus:{V1}", "--store", store_url]) == 0
    assert capsys.readouterr().out.strip() == f"corpus@production: (none) -> {V1}"
    assert main(["release", f"corpus:{V2}", "--reason", "new dump", "--store", store_url]) == 0
    assert capsys.readouterr().out.strip() == f"corpus@production: {V1} -> {V2}"
    assert main(["release", f"corpus:{V2}", "--as", "staging", "--store", store_url]) == 0
    capsys.readouterr()
    assert main(["artifacts", "list", "--store", store_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["corpus", V1], ["corpus", V2]]
    assert "@" not in lines[0] and "@production @staging" in lines[1]
    assert main(["artifacts", "list", "--json", "--store", store_url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["aliases"] for m in listed] == [[], ["production", "staging"]]
    assert main(["release", "--rollback", "corpus", "--store", store_url]) == 0
    assert capsys.readouterr().out.strip() == f"corpus@production: {V2} -> {V1} (rollback)"
    assert Catalog(store_url).aliases() == {"corpus": {"production": V1, "staging": V2}}
    assert main(["release", "--log", "corpus", "--store", store_url]) == 0
    moves = [line.split(" ", 3)[:2] + [line.split(" ", 3)[3]] for line in capsys.readouterr().out.splitlines()]
    assert moves == [["corpus@production", "#1", f"release  (none) -> {V1}"],  # less the time of each move
                     ["corpus@production", "#2", f"release  {V1} -> {V2}  reason: new dump"],
                     ["corpus@production", "#3", f"rollback {V2} -> {V1}"],
                     ["corpus@staging", "#1", f"release  (none) -> {V2}"]]
    assert main(["release", "--log", "corpus", "--as", "staging", "--json", "--store", store_url]) == 0
    assert json.loads(capsys.readouterr().out) == Catalog(store_url).release_log("corpus", "staging")
    assert main(["release", "corpus", "--store", store_url]) == 2
    assert one_error_line(capsys) == ("corpus: give KIND:VERSION to release (`lexiflow artifacts list` shows them), "
                                      "or --rollback KIND")
    assert main(["release", "--rollback", f"corpus:{V1}", "--store", store_url]) == 2
    assert one_error_line(capsys).startswith(f"--rollback corpus:{V1}: give the kind alone")


@pytest.mark.usefixtures("quiet_logs")
def test_tag_and_generate_read_the_released_models(tmp_path, capsys):
    tagger_store = ArtifactStore(tmp_path / "store")
    for column, version, suffix in (("upos", UPOS_TAGGER, ""), ("xpos", XPOS_TAGGER, ""), ("upos", "c" * 16, "-new")):
        publish_tagger(tagger_store, column, version, suffix)  # the latest UPOS tagger is not the one released
    catalog = Catalog(tagger_store)
    catalog.release("tagger", UPOS_TAGGER)
    catalog.release("tagger", XPOS_TAGGER, "xpos")
    source = tmp_path / "text.txt"
    source.write_text("the cat sat. a dog ran.", encoding="utf-8")
    assert main(["tag", str(source), "--store", tagger_store.url, "--tagger", "tagger@production"]) == 0
    rows = token_rows(capsys.readouterr().out)
    assert len(rows) == 8 and {r[3] for r in rows} <= UPOS and {r[4] for r in rows} == {"_"}
    assert main(["tag", str(source), "--store", tagger_store.url, "--tagger", "tagger@production", "tagger@xpos"]) == 0
    rows = token_rows(capsys.readouterr().out)
    assert {r[3] for r in rows} <= UPOS and {r[4] for r in rows} <= XPOS
    assert main(["tag", str(source), "--store", tagger_store.url, "--tagger", "tagger@staging"]) == 2
    assert one_error_line(capsys).startswith("no alias 'staging' for tagger in ")

    (tmp_path / "lm").mkdir()
    store = ngram_store(tmp_path / "lm")
    lm = Catalog(store).latest("lm")["version"]
    Catalog(store).release("lm", lm)
    capsys.readouterr()
    assert main(["generate", "--store", store.url, "--prompt", "The", "--max-tokens", "2", "--lm", lm]) == 0
    by_version = capsys.readouterr().out
    assert main(["generate", "--store", store.url, "--prompt", "The", "--max-tokens", "2", "--lm", "lm@production"]) \
        == 0
    assert capsys.readouterr().out == by_version == "the café sat\n"
    assert main(["generate", "--store", store.url, "--prompt", "The", "--lm", "tokenizer@production"]) == 2
    assert one_error_line(capsys) == ("tokenizer@production names a tokenizer artifact where a lm one is wanted; give "
                                      "lm@production or a lm version")


def test_verify_reports_a_damaged_log_entry_and_an_alias_naming_a_missing_artifact(store_url, capsys):
    store = ArtifactStore(store_url)
    for version in (V1, V2):
        publish(store, "corpus", version)
    catalog = Catalog(store_url)
    catalog.release("corpus", V1)
    catalog.release("corpus", V2, "staging")
    store.delete("corpus", V2)  # behind the CLI's back (rm would refuse)
    damaged = f"{store.root}/.aliases/corpus/production/00000002.json"
    put(store, damaged, b'{"seq": 2, "to": "0123')  # a truncated entry: only tampering makes one
    with pytest.raises(StoreError, match="release log entry .*00000002.json: not valid JSON"):
        Catalog(store_url).released("corpus")
    assert main(["artifacts", "verify", "--store", store_url]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "00000002.json: not valid JSON" in lines[0]
    assert lines[1] == (f"corpus@staging names corpus:{V2}, which is not in the store; release another version: "
                        "lexiflow release corpus:VERSION --as staging")
    assert lines[2] == "1 artifacts checked (sizes), 2 problems"
    put(store, f"{store.root}/.aliases/corpus/canary/00000001.json",
        json.dumps({"seq": "1", "action": "release", "to": V1}).encode())  # valid JSON, not an entry
    with pytest.raises(StoreError, match="release log entry .*canary/00000001.json: not a release log entry"):
        Catalog(store_url).released("corpus", "canary")
