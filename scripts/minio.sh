#!/usr/bin/env bash
# Starts or stops a throwaway MinIO server on a free loopback port.
#   scripts/minio.sh start DIR   # data and state in DIR; prints `export` lines
#   scripts/minio.sh stop DIR
# The bucket `mado-test` is created with a SigV4-signed PUT (curl --aws-sigv4).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cmd="${1:?usage: minio.sh start|stop DIR}"; dir="${2:?usage: minio.sh start|stop DIR}"
user=madoadmin; pass=madoadmin-secret; bucket=mado-test

case "$cmd" in
start)
  mkdir -p "$dir/data"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  cport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  MINIO_ROOT_USER=$user MINIO_ROOT_PASSWORD=$pass MINIO_BROWSER=off \
    nohup "$MADO_TOOLS_DIR/bin/minio" server --quiet --address "127.0.0.1:$port" \
      --console-address "127.0.0.1:$cport" "$dir/data" >"$dir/minio.log" 2>&1 &
  echo $! >"$dir/minio.pid"
  # Startup only: wait (bounded) for the health endpoint.
  for _ in $(seq 1 150); do
    curl -sf "http://127.0.0.1:$port/minio/health/live" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$port/minio/health/live" >/dev/null || { echo "MinIO did not start; see $dir/minio.log" >&2; cat "$dir/minio.log" >&2; exit 1; }
  # Live is not ready: right after start MinIO may still refuse requests
  # (503 while it initializes), so the bucket is created with a bounded retry.
  made=""
  for _ in $(seq 1 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" -u "$user:$pass" \
      -X PUT "http://127.0.0.1:$port/$bucket" || true)
    if [ "$code" = 200 ] || [ "$code" = 409 ]; then made=1; break; fi
    sleep 0.2
  done
  [ -n "$made" ] || { echo "could not create bucket $bucket (last HTTP status $code); see $dir/minio.log" >&2; exit 1; }
  cat >"$dir/env" <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=$user
export AWS_SECRET_ACCESS_KEY=$pass
export AWS_REGION=us-east-1
export MADO_TEST_S3_URL=s3://$bucket
ENV
  cat "$dir/env"
  ;;
stop)
  [ -f "$dir/minio.pid" ] && kill "$(cat "$dir/minio.pid")" 2>/dev/null || true
  ;;
*) echo "usage: minio.sh start|stop DIR" >&2; exit 2 ;;
esac
