#!/usr/bin/env bash
# Scale (issue #46), by hand: a synthetic monorepo of N files (TOPS top
# directories x 10 x 100 small source files, one git commit made with git
# fast-import) imported into the embedded store; then, for mado, what each
# step costs in time and in a daemon's private memory (RssAnon), and for
# `find -printf %s` the same walk over git's own checkout of the tree.
# Usage: bench/scale.sh [MADO_BINARY] [TOPS...]   (default: a release build;
#        TOPS 10 100 = 10k and 100k files; 1000 = a million, ~10 min)
# Prints a markdown table on stdout, one row per tree size.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"

mado="${1:-}"
[ $# -gt 0 ] && shift
if [ -z "$mado" ]; then
  (cd "$MADO_ROOT" && cargo build -q --release -p mado)
  mado="$CARGO_TARGET_DIR/release/mado"
fi
tops=("$@")
[ ${#tops[@]} -eq 0 ] && tops=(10 100)

work=$(mktemp -d "${TMPDIR:-/tmp}/mado-scale.XXXXXX")
cleanup() {
  for d in "$work"/*/mnt "$work"/*/ws "$work"/*/ws2; do
    [ -d "$d" ] && { "$mado" umount "$d" >/dev/null 2>&1 || fusermount3 -uz "$d" 2>/dev/null || true; }
  done
  rm -rf "$work"
}
trap cleanup EXIT

# The tree: one commit of TOPS*1000 files, each a few lines of Rust.
gen() {
  python3 - "$1" <<'PY'
import sys
tops = int(sys.argv[1])
out = sys.stdout.buffer
out.write(b"commit refs/heads/main\ncommitter Gen <g@e> 1700000000 +0000\ndata 4\ngen\n")
out.write(b"M 644 inline README\ndata 6\nhello\n")
for t in range(tops):
    for s in range(10):
        for f in range(100):
            body = b"// file %d/%d/%d\nfn f%d() -> u32 { %d }\n" % (t, s, f, f, t * 1000 + s * 100 + f)
            out.write(b"M 644 inline pkg%04d/mod%d/f%03d.rs\ndata %d\n%s\n" % (t, s, f, len(body), body))
PY
}

secs() { local t0=$(date +%s.%N); "$@" >/dev/null; echo "$(date +%s.%N) - $t0" | bc; }
rss_mib() { awk '/RssAnon/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
daemon_of() { pgrep -f -- "$1 --foreground" | head -1; }

echo "| files | import s (max RSS MiB) | mount s | daemon MiB at rest | find over mount s | find over git checkout s | daemon MiB after find | ws create --mount s | ws status (10 edits) s | 2nd 10-edit checkpoint s | its bytes up | daemon MiB after | mount daemon MiB once forgotten | ws resume --mount s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for n in "${tops[@]}"; do
  d="$work/$n"
  mkdir -p "$d"
  export HOME="$d/home" MADO_CACHE_DIR="$d/cache" MADO_CONFIG="$d/config.toml" XDG_RUNTIME_DIR="$d/run"
  mkdir -p "$HOME" "$XDG_RUNTIME_DIR"
  chmod 700 "$XDG_RUNTIME_DIR"
  git init -q -b main "$d/repo"
  gen "$n" | git -C "$d/repo" fast-import --quiet
  git -C "$d/repo" checkout -q main
  files=$(git -C "$d/repo" ls-files | wc -l)
  "$mado" init --remote "$d/store" >/dev/null
  imp=$( { /usr/bin/time -f "%e %M" "$mado" import-git "$d/repo" -q >/dev/null; } 2>&1 | tail -1)
  mkdir -p "$d/mnt" "$d/ws"
  mnt_s=$(secs "$mado" mount main "$d/mnt")
  pid=$(daemon_of "$d/mnt")
  rest=$(rss_mib "$pid")
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  find_m=$(secs find "$d/mnt" -printf '%s\n')
  after=$(rss_mib "$pid")
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  # The kernel forgot the inodes (FORGET for each): what the daemon keeps
  # once its threads took requests again (each gives back what it freed
  # as it takes one; until then, up to tens of MiB sit freed in the heaps
  # of threads blocked on /dev/fuse) and the allocator's purge delay ran.
  sleep 2
  for i in 1 2 3 4 5 6 7 8; do
    (for j in $(seq 50); do stat "$d/mnt/absent-$i-$j" >/dev/null 2>&1 || true; done) &
  done
  wait
  sleep 10
  forgot=$(rss_mib "$pid")
  find_l=$(secs find "$d/repo" -path "$d/repo/.git" -prune -o -printf '%s\n')
  "$mado" umount "$d/mnt" >/dev/null
  create=$(secs "$mado" ws create w --from main --mount "$d/ws")
  wpid=$(daemon_of "$d/ws")
  edit() { for f in 0 1 2 3 4 5 6 7 8 9; do echo "// $1" >> "$d/ws/pkg000$f/mod$f/f00$f.rs"; done; }
  edit one
  status=$(cd "$d/ws" && secs "$mado" ws status)
  (cd "$d/ws" && "$mado" ws checkpoint >/dev/null)
  edit two
  t0=$(date +%s.%N)
  up=$(cd "$d/ws" && "$mado" ws checkpoint --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["remote"]["bytes_up"])')
  ckpt=$(echo "$(date +%s.%N) - $t0" | bc)
  wafter=$(rss_mib "$wpid")
  "$mado" umount "$d/ws" >/dev/null
  mkdir -p "$d/ws2"
  resume=$(secs "$mado" ws resume w "$d/ws2" --mount)
  "$mado" umount "$d/ws2" >/dev/null
  printf '| %s | %.1f (%.0f) | %.2f | %s | %.1f | %.1f | %s | %.2f | %.2f | %.2f | %s | %s | %s | %.2f |\n' \
    "$files" "${imp% *}" "$(echo "${imp#* } / 1024" | bc -l)" "$mnt_s" "$rest" "$find_m" "$find_l" "$after" \
    "$create" "$status" "$ckpt" "$up" "$wafter" "$forgot" "$resume"
done
