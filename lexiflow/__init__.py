"""lexiflow: a batch NLP pipeline on Prefect.

One installed package. Its subpackages live at the top of the repository (`models/`,
`storage/`, `tasks/`, `flows/`, `deployments/`) and are mapped under `lexiflow.` by
setuptools' `package-dir` (pyproject.toml), so lexiflow never claims global names such as
`storage` that other software (a Dask worker's spill folder) also uses.

`lexiflow.loaders` (this folder) turns an artifact into its model object; it sits above
`storage/` (bytes, schemas, versions, the catalog) and `models/`.
"""

import os

# Polars' allocator (jemalloc) keeps the pages a process frees for 3 s before it gives them back (polars' own
# setting: 0.5 s), so a shard's next tables reuse them instead of faulting in fresh zeroed pages. Fresh pages
# cost 2-4x more kernel time when two processes fault at once (Dask workers on one machine:
# benchmarks/results/scaling-notes.md).
# jemalloc reads this when polars loads, which appends it to its own defaults (the last setting wins): lexiflow
# is imported first wherever it runs (the CLI, flows, Dask workers unpickling its tasks). A user's own setting
# is kept here; the Dask workers lexiflow starts get its decay after it (`runners.new_worker_cluster`).
POLARS_ALLOCATOR = "dirty_decay_ms:3000,muzzy_decay_ms:0"
os.environ.setdefault("_RJEM_MALLOC_CONF", POLARS_ALLOCATOR)
