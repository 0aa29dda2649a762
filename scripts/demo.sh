#!/usr/bin/env bash
# mado's main job on the embedded local store, in a throwaway HOME:
# import a real git repository (this one, or $1), check it out from a cold
# cache, check it out again warm, and show the request counts each time.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$MADO_ROOT/scripts/ensure-deps.sh"
repo="$(cd "${1:-$MADO_ROOT}" && pwd)"
(cd "$MADO_ROOT" && cargo build -q --release --locked -p mado)
mado="$CARGO_TARGET_DIR/release/mado"

demo=$(mktemp -d "${TMPDIR:-/tmp}/mado-demo.XXXXXX")
export HOME="$demo/home" XDG_CACHE_HOME="" XDG_CONFIG_HOME="" XDG_DATA_HOME="" MADO_CACHE_DIR="" MADO_CONFIG=""
unset MADO_REMOTE_ADDR
mkdir -p "$HOME"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

step "$mado" init
step "$mado" import-git "$repo" --verbose
step "$mado" import-git "$repo" --verbose          # same commit again: uploads nothing
step "$mado" log -n 1
step "$mado" ls main
rm -rf "$HOME/.cache/mado"                         # cold cache: the packs are fetched
step "$mado" checkout main "$demo/cold" --verbose
step "$mado" checkout main "$demo/warm" --verbose  # warm cache: only the ref is read
step "$mado" cache stats
echo
if diff -r "$demo/cold" "$demo/warm" >/dev/null; then
  echo "cold and warm checkouts are identical: $demo/cold"
else
  echo "checkouts differ!" >&2; exit 1
fi
echo
echo "the mado binary this demo ran: $mado ($("$mado" --version))"
echo "put it on your PATH with: make install   (or: cargo install --locked --path crates/cli)"
