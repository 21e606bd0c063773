# The device check on a lent GPU machine without a package registry, from the repository's root with .devkit/device
# carried (`python -m benchmarks.device --pack` makes it, < 64 MiB): bash benchmarks/device.sh
# Results: device.md and device.parquet in $OUT (else ./device-results), the whole log beside them; copy their rows
# to benchmarks/results/device.{md,parquet}.
set -o pipefail
OUT=${OUT:-$PWD/device-results}
KIT=.devkit/device
CHECK=/tmp/devcheck  # the shared data the CUDA tests read goes to $CHECK/shared, beside the copied checkout
mkdir -p /tmp/site /tmp/lx "$CHECK/checkout/.devkit" "$OUT"
xz -dc $KIT/site.tar.xz | tar -C /tmp/site -xf - || exit 1
xz -dc $KIT/shared.tar.xz | tar -C "$CHECK" -xf - || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/lx . || exit 1
# the repository's lexiflow/ would shadow the installed package: the check runs from a copy
export PYTHONPATH=/tmp/lx:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L; git log --oneline -1 2>/dev/null
cp -r benchmarks tests "$CHECK/checkout/" && cp -r $KIT "$CHECK/checkout/.devkit/" && cd "$CHECK/checkout" || exit 1
python3 -m benchmarks device --results "$OUT" 2>&1 | tee "$OUT/log"
