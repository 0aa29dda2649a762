#!/usr/bin/env bash
# "Work in a workspace" (issue #20, part 3), by hand: the same commands on a
# plain directory of the local disk and in a read-write workspace mount of
# the same tree (embedded local store, warm: every file read once first),
# side by side, with the ratio. The tree: crate sources of this machine's
# cargo registry (whole crates in name order until ~12,000 files) as one
# git commit, plus a generated C project for the build row.
# Usage: bench/workspace-work.sh [MADO_BINARY]   (default: a release build)
# Prints a markdown table on stdout: each cell the median (min–max) over
# RUNS runs. A command that fails stops the script (exit 1, the command and
# its stderr on stderr) rather than being timed as if it had worked.
# `make bench` runs it as scenario n (bench/scenarios.py, class Work), which
# parses that table.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
runs=${RUNS:-3}
files_wanted=${FILES:-12000}

mado="${1:-}"
if [ -z "$mado" ]; then
  (cd "$MADO_ROOT" && cargo build -q --release -p mado)
  mado="$CARGO_TARGET_DIR/release/mado"
fi

REAL_HOME=$HOME
work=$(mktemp -d "${TMPDIR:-/tmp}/mado-work.XXXXXX")
mnt="$work/mnt"
export HOME="$work/home" XDG_CONFIG_HOME="$work/home/.config" XDG_DATA_HOME="$work/home/.local/share" \
  XDG_CACHE_HOME="$work/home/.cache" XDG_STATE_HOME="$work/home/.local/state"
unset MADO_CONFIG MADO_CACHE_DIR
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@localhost GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@localhost
cleanup() {
  "$mado" umount "$mnt" >/dev/null 2>&1 || fusermount3 -uz "$mnt" 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
mkdir -p "$HOME"

# The tree.
src="$work/src"
mkdir -p "$src"
n=0
for c in $(ls -d "$REAL_HOME"/.cargo/registry/src/*/*/ 2>/dev/null | sort); do
  [ "$n" -ge "$files_wanted" ] && break
  cp -r "$c" "$src/"
  n=$((n + $(find "$c" -type f | wc -l)))
done
# A C project of 120 files (the build row).
mkdir -p "$src/cproj"
for i in $(seq 1 120); do
  printf 'int f%d(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * %d; return s; }\n' "$i" "$i" > "$src/cproj/f$i.c"
done
{
  echo 'SRCS := $(wildcard *.c)'
  echo 'OBJS := $(SRCS:.c=.o)'
  echo 'libp.a: $(OBJS)'
  printf '\tar rcs $@ $^\n'
  echo '%.o: %.c'
  printf '\t$(CC) -O2 -c $< -o $@\n'
  echo 'clean:'
  printf '\trm -f *.o libp.a\n'
} > "$src/cproj/Makefile"
git -C "$src" init -q
git -C "$src" add -A
git -C "$src" commit -qm tree
files=$(git -C "$src" ls-files | wc -l)

"$mado" init >/dev/null
"$mado" import-git "$src" >/dev/null
"$mado" ws create work --from main --mount "$mnt" >/dev/null
local_dir="$work/local"
mkdir -p "$local_dir"
git -C "$src" archive HEAD | tar -x -C "$local_dir"
# Warm both: every file read once.
for d in "$local_dir" "$mnt"; do find "$d" -type f -exec cat {} + >/dev/null; done

t() { # seconds that "$@" takes; a failure is marked in $work/failed (`line` stops there)
  local s e rc=0
  s=$(date +%s.%N)
  "$@" >/dev/null 2>"$work/stderr" || rc=$?
  e=$(date +%s.%N)
  if [ "$rc" -ne 0 ]; then
    echo "failed (exit $rc): $*: $(tail -c 300 "$work/stderr")" >&2
    touch "$work/failed"
  fi
  echo "$e - $s" | bc
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cell() { # the times: "MEDIAN s", and "(MIN–MAX)" over more than one
  printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {printf "%.3f s", a[int((NR+1)/2)]
    if (NR > 1) printf " (%.3f–%.3f)", a[1], a[NR]}'
}
line() { # label, the local disk's times, the mount's (space-separated seconds)
  [ ! -e "$work/failed" ] || exit 1
  # shellcheck disable=SC2086 # the times are words
  printf '| %s | %s | %s | %.2f× |\n' "$1" "$(cell $2)" "$(cell $3)" "$(echo "$(median $3) / $(median $2)" | bc -l)"
}
sub=$(cd "$local_dir" && du -s -- */ | sort -n | tail -1 | cut -f2 | tr -d /)
sedfiles() { (cd "$1" && git ls-files 2>/dev/null || find . -name '*.rs') | grep '\.rs$' | head -500; }

row() { # label, then a function called with the directory; the two sides alternate, so both see the same machine
  local label=$1 fn=$2 a="" b=""
  for _ in $(seq "$runs"); do
    a="$a $("$fn" "$local_dir")"
    b="$b $("$fn" "$mnt")"
  done
  line "$label" "$a" "$b"
}
# grep exits 1 when nothing matches, as here: only 0 (a match) or 2 (an error) fail.
op_grep() { t sh -c "grep -r --exclude-dir=.git -q 'no such string in the tree xyzzy' '$1'; [ \$? -eq 1 ]"; }
op_status() { t git -C "$1" status --porcelain; }
op_read() { t sh -c "find '$1' -path '$1/.git' -prune -o -type f -print0 | xargs -0 cat"; }
op_stat() { t find "$1" -path "$1/.git" -prune -o -printf '%s\n'; }
op_cp() { rm -rf "$1/copy"; t cp -r "$1/$sub" "$1/copy"; }
op_rm() { rm -rf "$1/copy"; cp -r "$1/$sub" "$1/copy"; sync; t rm -rf "$1/copy"; }
op_sed() { t bash -c "cd '$1' && sedfiles . | xargs sed -i 's/^/ /'"; }
op_build() { make -s -C "$1/cproj" clean >/dev/null; t make -s -j2 -C "$1/cproj"; }
export -f sedfiles

echo "Files: $files in the tree (+120 C files); subtree copied: $sub; $runs runs each (the git row: one), median (min–max); warm."
echo
echo "| work | local disk | workspace mount | ratio |"
echo "|---|---|---|---|"
# git first, once: the repository the other rows' `git status` reads.
line "git init && git add -A && git commit" "$(t sh -c "cd '$local_dir' && git init -q && git add -A && git commit -qm x")" \
  "$(t sh -c "cd '$mnt' && git init -q && git add -A && git commit -qm x")"
row "git status (clean)" op_status
row "grep -r (no match)" op_grep
row "find -printf %s (stat every file)" op_stat
row "read every file (cat)" op_read
row "cp -r of the largest top-level directory ($sub)" op_cp
row "rm -rf of that copy" op_rm
row "sed -i on 500 files" op_sed
row "make -j2 of 120 C files" op_build
