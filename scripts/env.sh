# Shared settings for mado's scripts; sourced, not run.
# Expensive things are cached outside the clone, in stable places:
#   cargo's target folder: $MADO_BUILD_DIR (default ~/.cache/mado-build/target)
#   the MinIO binary:      $MADO_TOOLS_DIR/bin/minio (default ~/.cache/mado-tools)
export MADO_TOOLS_DIR="${MADO_TOOLS_DIR:-$HOME/.cache/mado-tools}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${MADO_BUILD_DIR:-$HOME/.cache/mado-build/target}}"
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$PATH"
MADO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export MADO_ROOT
