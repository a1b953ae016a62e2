#!/usr/bin/env bash
# A second build of tandem in the same call, from the tree with the files under $VARIANT_DIR laid over it (a
# carried folder mirroring repository paths, e.g. kernels no GPU has run yet), into /tmp/variant-src/build:
# run beside gpu_tests (PAR=1), then scripts/device/variant_check.sh tests and times it against main's build.
# Only the CLI and the GPU test binary are built.
set -uo pipefail
VARIANT_DIR=${VARIANT_DIR:-.peer/variant}; OUT=${OUT:-/tmp/variant_build}; mkdir -p "$OUT"
VSRC=/tmp/variant-src
[ -d "$VARIANT_DIR" ] || { echo "no $VARIANT_DIR: nothing to build"; exit 1; }
rm -rf "$VSRC" && mkdir -p "$VSRC"
tar cf - --exclude=./build-gpu --exclude=./build --exclude=./.peer --exclude=./.debs . | tar xf - -C "$VSRC"
cp -r "$VARIANT_DIR/." "$VSRC/"
echo "variant files:"; (cd "$VARIANT_DIR" && find . -type f | sed 's/^/  /')
t0=$SECONDS
(cd "$VSRC" && cmake -S . -B build -G Ninja -DTANDEM_CUDA=ON -DTANDEM_WERROR=ON -DTANDEM_MPI=OFF \
  -DCMAKE_BUILD_TYPE=Release ${TANDEM_EXTRA_CMAKE:-} && cmake --build build -j "${VARIANT_JOBS:-8}" --target tandem_cli tandem_gpu_tests) \
  >"$OUT/build.log" 2>&1
rc=$?
grep -E "error:|warning:" "$OUT/build.log" | sort | uniq | head -20
echo "variant build rc=$rc in $((SECONDS - t0)) s"
exit $rc
