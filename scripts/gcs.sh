#!/usr/bin/env bash
# Starts or stops a throwaway fake-gcs-server (a Google Cloud Storage emulator)
# on a free loopback port.
#   scripts/gcs.sh start DIR   # data and state in DIR; prints `export` lines
#   scripts/gcs.sh stop DIR
# Clients reach it without Google credentials: DIR/service-account.json has
# "disable_oauth": true and "gcs_base_url", which object_store's
# GoogleCloudStorageBuilder::from_env reads through GOOGLE_SERVICE_ACCOUNT.
# The bucket `mado-test` is created through the JSON API (POST /storage/v1/b).
# Caveat: fake-gcs-server does not implement GCS's XML API object upload
# (PUT /BUCKET/OBJECT, used by object_store for put and copy): reads, lists
# and deletes work, writes through object_store get 400 "invalid uploadType".
set -euo pipefail
source "$(dirname "$0")/env.sh"
cmd="${1:?usage: gcs.sh start|stop DIR}"; dir="${2:?usage: gcs.sh start|stop DIR}"
bucket=mado-test

case "$cmd" in
start)
  mkdir -p "$dir/data"
  dir="$(cd "$dir" && pwd)"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  url="http://127.0.0.1:$port"
  # -public-host must be HOST:PORT as clients send it in Host: only then are
  # path-style requests (/BUCKET/OBJECT) routed as such.
  nohup "$MADO_TOOLS_DIR/bin/fake-gcs-server" -scheme http -host 127.0.0.1 -port "$port" \
      -public-host "127.0.0.1:$port" -external-url "$url" \
      -backend filesystem -filesystem-root "$dir/data" -log-level warn \
      >"$dir/gcs.log" 2>&1 &
  echo $! >"$dir/gcs.pid"
  # Startup only: wait (bounded) for the health endpoint.
  for _ in $(seq 1 150); do
    curl -sf "$url/_internal/healthcheck" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -sf "$url/_internal/healthcheck" >/dev/null || { echo "fake-gcs-server did not start; see $dir/gcs.log" >&2; cat "$dir/gcs.log" >&2; exit 1; }
  # 200 when made, 409 when it already exists (a restart on the same DIR).
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
    -d "{\"name\":\"$bucket\"}" "$url/storage/v1/b" || true)
  [ "$code" = 200 ] || [ "$code" = 409 ] || { echo "could not create bucket $bucket (HTTP status $code); see $dir/gcs.log" >&2; exit 1; }
  cat >"$dir/service-account.json" <<JSON
{"gcs_base_url": "$url", "disable_oauth": true, "client_email": "", "private_key_id": "", "private_key": ""}
JSON
  cat >"$dir/env" <<ENV
export GOOGLE_SERVICE_ACCOUNT=$dir/service-account.json
export MADO_GCS_ENDPOINT=$url
export MADO_GCS_BUCKET=$bucket
export MADO_TEST_GCS_URL=gs://$bucket
ENV
  cat "$dir/env"
  ;;
stop)
  [ -f "$dir/gcs.pid" ] && kill "$(cat "$dir/gcs.pid")" 2>/dev/null || true
  ;;
*) echo "usage: gcs.sh start|stop DIR" >&2; exit 2 ;;
esac
