"""Side-by-side benchmarks against peer libraries; `python -m benchmarks NAME` (see harness.py)."""

import lexiflow  # noqa: F401 - first: polars in a benchmark's process then runs as in the pipeline's (POLARS_ALLOCATOR)
