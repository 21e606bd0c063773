"""Tables people read (issue 61): the `release-checks` table shows the verdict first, figures to 4 significant
digits and both bounds of a range; `run-artifacts` names the released versions the checks compared against;
the report's key metric names a metric."""

from __future__ import annotations

from lexiflow.flows.release import checks_row
from lexiflow.models import checks
from lexiflow.storage import ArtifactStore
from lexiflow.tasks.report import KEY_METRIC, lineage_rows, publish_lineage


def test_the_checks_table_shows_the_verdict_first_4_digits_and_both_bounds_of_a_range():
    tokens = checks.within("corpus", "tokens", 5080, 58_612, 0.25, 10_000)
    row = checks_row(tokens.row())
    assert list(row)[:2] == ["passed", "blocking"] and (row["passed"], row["blocking"]) == (False, True)
    assert row["released"] == 58_612 and row["limit"] == "[4.396e+04, 7.326e+04]"
    spearman = checks_row(checks.at_least("evaluation.svd", "ws353_spearman", -0.0701453, 0.3123456, 0.05, 0).row())
    assert (spearman["value"], spearman["released"], spearman["limit"]) == (-0.07015, 0.3123, "0.2623")
    assert checks.markdown([tokens])[0].startswith("| passed | blocking | check |")
    assert "| **no** | yes | corpus.tokens | 5080 | 58612 | [4.396e+04, 7.326e+04] |" in checks.markdown([tokens])[2]
    # a manifest written before the bounds were recorded still reads
    old = {k: v for k, v in tokens.row().items() if k not in ("low", "high")}
    assert checks_row(old)["limit"] == "4.396e+04"


def test_run_artifacts_names_the_released_versions_the_checks_compared_against(tmp_path, monkeypatch):
    from lexiflow.tasks import report as report_module

    monkeypatch.setattr(report_module, "read_lineage", lineage_rows)  # its task, without a Prefect server
    shown = {}
    for name in ("create_table_artifact", "create_markdown_artifact"):
        monkeypatch.setattr(report_module, name, lambda data, key, **_: shown.__setitem__(key, data))
    store = ArtifactStore(tmp_path)

    def made(kind: str, version: str, metrics: dict, **inputs) -> object:
        with store.writer(kind, version, inputs=inputs) as out:
            out.write_text("x.txt", "x")
            out.metrics.update(metrics)
        return store.ref(kind, version)

    released, candidate = made("corpus", "a" * 16, {"tokens": 100}), made("corpus", "b" * 16, {"tokens": 90})
    checked = made("checks", "c" * 16, {"passed": True}, **{"candidates.corpus": candidate,
                                                             "released.corpus": released})
    report = made("report", "d" * 16, {"embeddings": 1, "ws353_spearman": 0.31234}, checks=checked)
    rows = {row["artifact"]: row for row in publish_lineage({"corpus": candidate, "checks": checked, "report": report})}
    assert rows[f"corpus:{'a' * 16}"]["name"] == "corpus (released)"
    assert rows[f"corpus:{'b' * 16}"]["name"] == "corpus"
    assert f"| corpus (released) | `corpus:{'a' * 16}` |" in shown["run-artifacts"]
    assert KEY_METRIC["report"] == "ws353_spearman"
    assert lineage_rows([report])[-1]["key metric"] == "ws353_spearman 0.312"
