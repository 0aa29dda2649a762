#!/usr/bin/env bash
# Measures the pack-root choice on a real tree: a cold whole-tree walk
# (`mado materialize`, fresh cache) unpacked, with v1 per-directory packs
# and with v2 recursive packs, on the embedded local store. Prints one
# markdown row per mode: GETs, ranged GETs, bytes, wall time, and the
# modeled GET counts `mado pack` reports.
#
#   bench/pack-shapes.sh DIR LABEL [RTT_MS]
#
# DIR is committed to a scratch git repository first (ignored files too);
# RTT_MS adds a fixed delay per request (default 0).
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
dir="$(cd "$1" && pwd)"; label="$2"; rtt="${3:-0}"
(cd "$MADO_ROOT" && cargo build -q --release -p mado)
mado="$CARGO_TARGET_DIR/release/mado"
work=$(mktemp -d "${TMPDIR:-/tmp}/mado-shapes.XXXXXX")
trap 'rm -rf "$work"' EXIT
export HOME="$work/home" MADO_REMOTE_ADDR="file://$work/store" XDG_CACHE_HOME="" XDG_CONFIG_HOME="" XDG_DATA_HOME="" MADO_CACHE_DIR=""
mkdir -p "$HOME"
g="$work/repo.git"
git init -q --bare "$g"
git --git-dir="$g" --work-tree="$dir" add -A -f
GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@b GIT_COMMITTER_NAME=b GIT_COMMITTER_EMAIL=b@b \
  git --git-dir="$g" --work-tree="$dir" commit -q -m "$label"
files=$(git --git-dir="$g" ls-tree -r HEAD | wc -l)
dirs=$(git --git-dir="$g" ls-tree -r -d HEAD | wc -l)
t0=$(date +%s.%N)
"$mado" import-git "$g" --no-packs --json > "$work/import.json"
t1=$(date +%s.%N)
echo "imported $label: $files files, $dirs dirs in $(echo "$t1 - $t0" | bc) s" >&2

walk() {  # mode label
  rm -rf "$HOME/.cache/mado"
  local s e; s=$(date +%s.%N)
  MADO_INJECT_RTT_MS=$rtt "$mado" materialize --json > "$work/walk.json"
  e=$(date +%s.%N)
  python3 - "$work/walk.json" "$1" "$(echo "$e - $s" | bc)" "$2" <<'PY'
import json, sys
w = json.load(open(sys.argv[1])); mode, secs, model = sys.argv[2], float(sys.argv[3]), sys.argv[4]
r = w["remote"]
print(f"| {mode} | {r['gets'] + r['ranged_gets']} | {r['ranged_gets']} | {r['bytes_down'] / 1e6:.1f} MB | {secs:.2f} s | {model} |")
PY
}
echo "| mode | GETs | of which ranged | bytes down | wall | modeled GETs (\`mado pack\`) |"
echo "|---|---|---|---|---|---|"
walk unpacked "–"
"$mado" pack --per-dir --json > "$work/v1.json"
model() {  # pack report JSON -> the modeled-GETs cell
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['model_gets_packed']} ({r['packs']} packs, {r['members']} packed, {r['unpacked_objects']} alone; unpacked model {r['model_gets_unpacked']}; built in {r['build_ms']} ms)")
PY
}
v1=$(model "$work/v1.json")
walk "v1 per-dir" "$v1"
"$mado" pack --recursive --json > "$work/v2.json"
v2=$(model "$work/v2.json")
walk "v2 recursive" "$v2"
