#!/usr/bin/env bash
# POSIX conformance of a workspace mount: runs pjdfstest (the Rust port of
# the suite ext4, ZFS and many FUSE filesystems run; crates.io pjdfstest,
# pinned below, built once into $MADO_BUILD_DIR/../pjdfstest) against a
# read-write workspace mount made with --allow-other, as root, switching to
# the users nobody, daemon and bin as the suite needs. Every test case must
# pass except those in scripts/pjdfstest-expected-failures.txt (device
# nodes: the mount is nodev). Prints the runner's summary; exits non-zero
# on any other failure.
# Usage: scripts/pjdfstest.sh [MADO_BINARY]   (default: a debug build)
set -euo pipefail
source "$(dirname "$0")/env.sh"
PJDFSTEST_VERSION=0.2.0

if [ "$(id -u)" != 0 ]; then
  msg="pjdfstest: needs root (it switches users, and --allow-other needs root here)"
  if [ "${MADO_REQUIRE_FUSE:-}" = 1 ]; then echo "$msg" >&2; exit 1; fi
  echo "$msg; skipped" >&2; exit 0
fi

tool_root="$(dirname "$CARGO_TARGET_DIR")/pjdfstest"
pjd="$tool_root/bin/pjdfstest"
if ! "$pjd" --version 2>/dev/null | grep -q "$PJDFSTEST_VERSION"; then
  echo "building pjdfstest $PJDFSTEST_VERSION into $tool_root (once)" >&2
  CARGO_TARGET_DIR="$tool_root/target" cargo install -q pjdfstest --version "$PJDFSTEST_VERSION" --locked --root "$tool_root"
fi

mado="${1:-}"
if [ -z "$mado" ]; then
  (cd "$MADO_ROOT" && cargo build -q -p mado)
  mado="$CARGO_TARGET_DIR/debug/mado"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mado-pjdfstest.XXXXXX")
mnt="$work/mnt"
export HOME="$work/home" XDG_CONFIG_HOME="$work/home/.config" XDG_DATA_HOME="$work/home/.local/share" \
  XDG_CACHE_HOME="$work/home/.cache" XDG_STATE_HOME="$work/home/.local/state"
unset MADO_CONFIG MADO_CACHE_DIR
cleanup() {
  "$mado" umount "$mnt" >/dev/null 2>&1 || fusermount3 -uz "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$HOME"
# The mount point and the folders above it: other users must reach it.
chmod 755 "$work" "$HOME"

git init -q "$work/repo"
echo "pjdfstest" > "$work/repo/README"
git -C "$work/repo" add README
git -C "$work/repo" -c user.name=mado -c user.email=mado@localhost commit -qm "pjdfstest base"
"$mado" init >/dev/null
"$mado" import-git "$work/repo" >/dev/null
"$mado" ws create pjdfstest --from main --mount "$mnt" --allow-other >/dev/null

{
  echo '[features]'
  echo 'posix_fallocate = {}'
  echo 'utime_now = {}'
  echo 'utimensat = {}'
  echo 'rename_ctime = {}'
  echo '[settings]'
  echo 'naptime = 0.01'
  echo 'allow_remount = false'
  echo 'expected_failures = ['
  { grep -v '^#' "$MADO_ROOT/scripts/pjdfstest-expected-failures.txt" || true; } | sed 's/.*/  "&",/'
  echo ']'
  echo '[dummy_auth]'
  echo 'entries = [["nobody", "nogroup"], ["daemon", "daemon"], ["bin", "bin"]]'
} > "$work/pjdfstest.toml"

mkdir "$mnt/t"
log="$work/pjdfstest.log"
set +e
(cd "$mnt/t" && "$pjd" -c "$work/pjdfstest.toml" -p "$mnt/t") > "$log" 2>&1
rc=$?
set -e
unexpected=$(grep -E "FAILED$" "$log" | awk '{print $1}' | grep -vxFf <(grep -v '^#' "$MADO_ROOT/scripts/pjdfstest-expected-failures.txt") || true)
summary=$(grep '^Summary' "$log" || echo "no summary: the runner stopped")
echo "pjdfstest $PJDFSTEST_VERSION in a workspace mount: $summary" >&2
if [ "$rc" != 0 ] || [ -n "$unexpected" ]; then
  for t in $unexpected; do
    grep -A4 "^$t " "$log" | grep -v -E "^\s+[0-9]+:|^\s+at " >&2 || true
  done
  echo "pjdfstest: failures beyond the expected ones: ${unexpected:-none (the runner failed: see above)}" >&2
  tail -20 "$log" >&2
  exit 1
fi
# What the suite left in the mount checkpoints (FIFOs and sockets are left out).
"$mado" ws checkpoint --dir "$mnt" -m "after pjdfstest" >/dev/null
echo "pjdfstest: passed" >&2
