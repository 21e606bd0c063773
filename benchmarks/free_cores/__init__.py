"""Running the scaling benchmark on a machine with free cores and no package registry (`pack.py`, `run.sh`)."""
