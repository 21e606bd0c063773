"""Side-by-side benchmarks against peer libraries; `python -m benchmarks NAME` (see harness.py)."""
