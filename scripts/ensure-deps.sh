#!/usr/bin/env bash
# Installs what mado's build and tests need, if missing:
#   Debian packages: fuse3, libfuse3-dev, pkg-config, git, curl
#   the MinIO server (built with `go install`, cached in $MADO_TOOLS_DIR)
#   with --emulators: fake-gcs-server (`go install`) and Azurite (npm), the
#   Google Cloud Storage and Azure Blob emulators, cached in $MADO_TOOLS_DIR
# Usage: scripts/ensure-deps.sh [--minio] [--bench] [--emulators]
set -euo pipefail
source "$(dirname "$0")/env.sh"

want_minio=""; want_bench=""; want_emulators=""
for a in "$@"; do
  case "$a" in
    --minio) want_minio=1 ;;
    --bench) want_minio=1; want_bench=1 ;;
    --emulators) want_emulators=1 ;;
    *) echo "usage: scripts/ensure-deps.sh [--minio] [--bench] [--emulators]" >&2; exit 2 ;;
  esac
done

# MinIO has no tagged Go module versions: pinned to the pseudo-version of
# its commit 7aac2a2c5b7c (2026-02-12), the newest the Go module proxy serves here.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
FAKE_GCS_VERSION=v1.56.1
AZURITE_VERSION=3.37.0

pkgs=(fuse3 libfuse3-dev pkg-config git curl)
[ -n "$want_bench" ] && pkgs+=(rclone s3fs python3-matplotlib)
# Azurite runs on node; Debian's packages when this machine has none.
[ -n "$want_emulators" ] && ! command -v npm >/dev/null && pkgs+=(nodejs npm)
need_pkgs=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need_pkgs[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "error: cargo (Rust) is not installed; install it with rustup (https://rustup.rs)" >&2
  exit 1
fi

# The pinned version is read from the binary's own build information.
minio_ok() {
  [ -x "$MADO_TOOLS_DIR/bin/minio" ] &&
    go version -m "$MADO_TOOLS_DIR/bin/minio" 2>/dev/null | grep -q "github.com/minio/minio[[:space:]]*$MINIO_VERSION"
}
if [ -n "$want_minio" ] && ! minio_ok; then
  if ! command -v go >/dev/null; then
    echo "error: go is needed to build MinIO (apt-get install golang, or put go on PATH)" >&2
    exit 1
  fi
  echo "building MinIO into $MADO_TOOLS_DIR/bin (once; takes a few minutes)" >&2
  mkdir -p "$MADO_TOOLS_DIR/bin"
  (cd /tmp && GOBIN="$MADO_TOOLS_DIR/bin.tmp" GOFLAGS=-mod=mod go install "github.com/minio/minio@$MINIO_VERSION")
  mv "$MADO_TOOLS_DIR/bin.tmp/minio" "$MADO_TOOLS_DIR/bin/minio"
  rmdir "$MADO_TOOLS_DIR/bin.tmp" 2>/dev/null || true
fi

# The emulators for gs:// and az:// tests (scripts/gcs.sh, scripts/azurite.sh).
fake_gcs_ok() {
  [ -x "$MADO_TOOLS_DIR/bin/fake-gcs-server" ] &&
    go version -m "$MADO_TOOLS_DIR/bin/fake-gcs-server" 2>/dev/null | grep -q "github.com/fsouza/fake-gcs-server[[:space:]]*$FAKE_GCS_VERSION"
}
if [ -n "$want_emulators" ] && ! fake_gcs_ok; then
  if ! command -v go >/dev/null; then
    echo "error: go is needed to build fake-gcs-server (apt-get install golang, or put go on PATH)" >&2
    exit 1
  fi
  echo "building fake-gcs-server into $MADO_TOOLS_DIR/bin (once)" >&2
  mkdir -p "$MADO_TOOLS_DIR/bin"
  (cd /tmp && GOBIN="$MADO_TOOLS_DIR/bin.tmp" GOFLAGS=-mod=mod go install "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION")
  mv "$MADO_TOOLS_DIR/bin.tmp/fake-gcs-server" "$MADO_TOOLS_DIR/bin/fake-gcs-server"
  rmdir "$MADO_TOOLS_DIR/bin.tmp" 2>/dev/null || true
fi

# Azurite is a node package: installed under $MADO_TOOLS_DIR/azurite (not
# globally); its version is read from its installed package.json. It declares
# node >= 22 but runs on node 20 (npm only warns).
azurite_ok() {
  local pj="$MADO_TOOLS_DIR/azurite/node_modules/azurite/package.json"
  [ -f "$pj" ] && [ "$(node -p "require('$pj').version" 2>/dev/null)" = "$AZURITE_VERSION" ]
}
if [ -n "$want_emulators" ] && ! azurite_ok; then
  if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "error: node and npm are needed to install Azurite (apt-get install nodejs npm)" >&2
    exit 1
  fi
  echo "installing Azurite $AZURITE_VERSION into $MADO_TOOLS_DIR/azurite (once)" >&2
  mkdir -p "$MADO_TOOLS_DIR/azurite"
  npm install --prefix "$MADO_TOOLS_DIR/azurite" --no-audit --no-fund --loglevel=error \
    "azurite@$AZURITE_VERSION" >/dev/null
fi

# The plots need matplotlib in the python3 on PATH (Debian's package serves
# /usr/bin/python3; another python3 gets it from PyPI).
if [ -n "$want_bench" ] && ! python3 -c 'import matplotlib' 2>/dev/null; then
  echo "installing matplotlib for $(command -v python3)" >&2
  python3 -m pip install -q matplotlib >/dev/null 2>&1 || echo "warning: matplotlib unavailable: the benchmark report will have no plots" >&2
fi
