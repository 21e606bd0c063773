"""Run-to-run spread of the word-similarity figures the release checks compare, behind the defaults of
`checks.similarity_delta` and `checks.similarity_floor_z` (docs/operations.md, "Releases"): skip-gram on the
lee corpus over 5 seeds and over 5 rebuilds on 95% of its documents, and random vectors over its vocabulary.
Not a harness benchmark (no peer): `OMP_NUM_THREADS=1 python -m benchmarks.check_spread` prints the figures."""

from __future__ import annotations

import numpy as np
from gensim.models import KeyedVectors, Word2Vec
from gensim.test.utils import datapath
from gensim.utils import simple_preprocess
from lexiflow.models.evaluation import word_similarity

SETS = ("ws353", "simlex999")


def sgns(docs: list[list[str]], seed: int) -> KeyedVectors:
    return Word2Vec(docs, vector_size=100, window=5, min_count=2, sg=1, negative=5, epochs=25, seed=seed,
                    workers=1).wv


def rho(kv: KeyedVectors) -> dict[str, float]:
    return {name: word_similarity(kv, name)["spearman"] for name in SETS}


def show(case: str, runs: list[dict[str, float]]) -> None:
    for name in SETS:
        xs = [run[name] for run in runs]
        print(f"{case:<22} {name:<10} mean {np.mean(xs):.4f} sd {np.std(xs, ddof=1):.4f} "
              f"min {min(xs):.4f} max {max(xs):.4f}")


def main() -> None:
    docs = [simple_preprocess(line) for line in open(datapath("lee_background.cor"), encoding="utf-8")]
    show("skip-gram, 5 seeds", [rho(sgns(docs, seed)) for seed in range(5)])
    rebuilds = []
    for draw in range(5):  # a rebuild on a slightly changed corpus
        keep = np.random.default_rng(draw).random(len(docs)) < 0.95
        rebuilds.append(rho(sgns([d for d, k in zip(docs, keep, strict=True) if k], 0)))
    show("skip-gram, 95% docs", rebuilds)
    kv, rng = sgns(docs, 0), np.random.default_rng(0)
    randoms = []
    for _ in range(20):  # no signal at all: the spread of rho is 1/sqrt(n - 1) over n pairs
        random = KeyedVectors(100)
        random.add_vectors(kv.index_to_key, rng.standard_normal((len(kv), 100)).astype(np.float32))
        randoms.append(rho(random))
    show("random vectors, 20", randoms)
    for name, pairs in (("ws353", 353), ("simlex999", 999)):
        n = pairs * (1 - word_similarity(kv, name)["oov_rate"])
        print(f"{name}: {n:.0f} pairs evaluated, 1/sqrt(n-1) = {1 / np.sqrt(n - 1):.4f}")


if __name__ == "__main__":
    main()
