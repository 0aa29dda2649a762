#!/usr/bin/env bash
# The whole test suite: installs what is missing, starts a real MinIO on a
# free loopback port, and runs every test (S3 tests are required here:
# MADO_REQUIRE_S3=1 turns a missing server into a failure, not a skip).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$MADO_ROOT/scripts/ensure-deps.sh" --bench --emulators
# The guest that serve-virtiofs is tested in: QEMU, a Debian kernel and a
# busybox initramfs, installed and built once (cached in $MADO_TOOLS_DIR/vm).
"$MADO_ROOT/scripts/vm-run.sh" --prepare

state=$(mktemp -d "${TMPDIR:-/tmp}/mado-test.XXXXXX")
mkdir -p "$state/gcs" "$state/azurite"
trap '"$MADO_ROOT/scripts/minio.sh" stop "$state"; "$MADO_ROOT/scripts/gcs.sh" stop "$state/gcs"; "$MADO_ROOT/scripts/azurite.sh" stop "$state/azurite"; rm -rf "$state"' EXIT
"$MADO_ROOT/scripts/minio.sh" start "$state" >/dev/null
# The Google Cloud Storage and Azure Blob emulators, for gs:// and az://.
"$MADO_ROOT/scripts/gcs.sh" start "$state/gcs" >/dev/null
"$MADO_ROOT/scripts/azurite.sh" start "$state/azurite" >/dev/null
# shellcheck disable=SC1091
source "$state/env"; source "$state/gcs/env"; source "$state/azurite/env"
export MADO_REQUIRE_S3=1 MADO_REQUIRE_FUSE=1 MADO_REQUIRE_VM=1 MADO_REQUIRE_EMULATORS=1
echo "MinIO at $AWS_ENDPOINT_URL (bucket ${MADO_TEST_S3_URL#s3://}); $MADO_TEST_GCS_URL at $MADO_GCS_ENDPOINT; $MADO_TEST_AZURE_URL at $AZURITE_BLOB_STORAGE_URL" >&2

cd "$MADO_ROOT"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast -- --test-threads="${MADO_TEST_THREADS:-4}"

# POSIX conformance of a workspace mount (pjdfstest; device nodes are the
# listed exceptions).
"$MADO_ROOT/scripts/pjdfstest.sh" "$CARGO_TARGET_DIR/debug/mado"

# The benchmark harness, small and fast, as a smoke test: it must produce
# the report and its plots (no timing is checked).
bench_out="$state/bench/BENCHMARKS.md"
python3 "$MADO_ROOT/bench/run.py" --quick --profile debug --out "$bench_out"
grep -q "## mado against the best peer" "$bench_out"
for s in a-dense b-dense c d e f-readers g h-dense; do
  grep -q "bench-$s.png" "$bench_out" || { echo "bench smoke test: no plot for $s in $bench_out" >&2; exit 1; }
done
echo "bench smoke test: report and plots produced" >&2
