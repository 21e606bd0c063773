# The scaling benchmark's sharded stages at 1 GB on one process and 2, 4 and 8 Dask workers, on a machine
# with free cores and no package registry, from the repository's root, with `.devkit` carried there
# (`python -m benchmarks.free_cores.pack` makes it): WORKERS=4,8 SIZES=1 bash benchmarks/free_cores/run.sh
# Results: scaling.md and scaling.parquet in $OUT (else ./free-cores-results), the whole log beside them; their rows
# go to benchmarks/results/free_cores.md.
set -o pipefail
OUT=${OUT:-$PWD/free-cores-results}
mkdir -p /tmp/site /tmp/lx /tmp/bench "$OUT"
xz -dc .devkit/site.tar.xz | tar -C /tmp/site -xf - || exit 1
xz -dc .devkit/pool.txt.xz > /tmp/pool.txt || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/lx . || exit 1
# one thread a worker, as the benchmark's clusters are; the repository's lexiflow/ would shadow the package
export PYTHONPATH=/tmp/lx:/tmp/site OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
nproc --all; git log --oneline -1 2>/dev/null; cp -r benchmarks /tmp/bench/ && cd /tmp/bench || exit 1
python3 -m benchmarks scaling --option workers="${WORKERS:-4,8}" --option sizes_gb="${SIZES:-1}" \
  --option stages=sharded --option pool=/tmp/pool.txt --results "$OUT" 2>&1 | tee "$OUT/log"
