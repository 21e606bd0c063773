"""The whole pipeline on the default corpus: cold run vs a cached rerun (same store), in one
process against one Prefect server (its start-up is not counted)."""

from __future__ import annotations

import tempfile
import time

from lexiflow.flows.params import validate
from lexiflow.flows.pipeline import run_pipeline
from prefect import flow
from prefect.testing.utilities import prefect_test_harness

from benchmarks.harness import Row


@flow
def _warm_up() -> None:
    """Starts the server and imports, so the timed runs measure the pipeline alone."""


def run(quick: bool = False) -> list[Row]:
    overrides = {"corpus": {"sources": ["builtin:lee"]}, "svd": {"dim": 50}} if quick else {}
    with tempfile.TemporaryDirectory() as store, prefect_test_harness(server_startup_timeout=120):
        _warm_up()
        params = validate({"store": store, **overrides})
        start = time.perf_counter()
        run_pipeline(params)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        run_pipeline(params)
        cached = time.perf_counter() - start
    corpus = "builtin:lee, svd.dim 50" if quick else "default corpus (builtin:enwiki), default parameters"
    return [
        Row("pipeline", corpus, "cold seconds", cold, None, "", False, "< 600", cold < 600),
        Row("pipeline", corpus, "cached seconds", cached, cold, "cold run", False, "ratio <= 0.1",
            cached <= 0.1 * cold),
    ]
