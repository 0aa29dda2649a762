#!/usr/bin/env bash
# Starts or stops a throwaway Azurite blob service (an Azure Blob Storage
# emulator) on a free loopback port.
#   scripts/azurite.sh start DIR   # data and state in DIR; prints `export` lines
#   scripts/azurite.sh stop DIR
# Azurite serves the well-known emulator account devstoreaccount1, path-style
# (http://127.0.0.1:PORT/devstoreaccount1/CONTAINER/BLOB). The container
# `mado-test` is created with a SharedKey-signed PUT (openssl HMAC-SHA256).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cmd="${1:?usage: azurite.sh start|stop DIR}"; dir="${2:?usage: azurite.sh start|stop DIR}"
account=devstoreaccount1
key='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='
container=mado-test

# Create Container, signed with the account key
# (https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key).
create_container() {
  local url=$1 date version=2021-08-06 sts hexkey sig
  date=$(LC_ALL=C TZ=GMT date '+%a, %d %b %Y %H:%M:%S GMT')
  # VERB, 11 standard headers (all empty: Content-Length 0 is signed as empty),
  # x-ms-* headers, then the resource: /ACCOUNT + URL path + query parameters.
  sts=$(printf 'PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:%s\nx-ms-version:%s\n/%s/%s/%s\nrestype:container' \
    "$date" "$version" "$account" "$account" "$container")
  hexkey=$(printf '%s' "$key" | base64 -d | od -An -v -tx1 | tr -d ' \n')
  sig=$(printf '%s' "$sts" | openssl dgst -sha256 -mac HMAC -macopt "hexkey:$hexkey" -binary | base64 -w0)
  curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Content-Length: 0' \
    -H "x-ms-date: $date" -H "x-ms-version: $version" \
    -H "Authorization: SharedKey $account:$sig" \
    "$url/$account/$container?restype=container" || true
}

case "$cmd" in
start)
  mkdir -p "$dir/data"
  dir="$(cd "$dir" && pwd)"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  url="http://127.0.0.1:$port"
  # --loose: ignore headers and parameters Azurite does not implement instead
  # of failing the request; --skipApiVersionCheck: accept the x-ms-version
  # object_store sends even if newer than this Azurite knows.
  nohup node "$MADO_TOOLS_DIR/azurite/node_modules/azurite/dist/src/blob/main.js" \
      --blobHost 127.0.0.1 --blobPort "$port" --location "$dir/data" \
      --skipApiVersionCheck --loose --disableProductStyleUrl --disableTelemetry --silent \
      >"$dir/azurite.log" 2>&1 &
  echo $! >"$dir/azurite.pid"
  # Startup only: wait (bounded) until it answers HTTP at all (an unsigned
  # request gets 403, which is enough to know it listens). Node loads
  # Azurite's modules from the disk: 3 s warm, 14 s with a cold page cache,
  # and once over 30 s on a busy 2-core machine; so up to 90 s, and no
  # longer than the process lives.
  for _ in $(seq 1 450); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/$account?comp=list" 2>/dev/null)" != 000 ] && break
    kill -0 "$(cat "$dir/azurite.pid")" 2>/dev/null || break
    sleep 0.2
  done
  # 201 when made, 409 when it already exists (a restart on the same DIR).
  code=$(create_container "$url")
  [ "$code" = 201 ] || [ "$code" = 409 ] || { echo "could not create container $container (HTTP status $code); see $dir/azurite.log" >&2; cat "$dir/azurite.log" >&2; exit 1; }
  cat >"$dir/env" <<ENV
export AZURE_STORAGE_USE_EMULATOR=true
export AZURITE_BLOB_STORAGE_URL=$url
export AZURE_STORAGE_ACCOUNT_NAME=$account
export AZURE_STORAGE_ACCOUNT_KEY=$key
export MADO_AZURE_CONTAINER=$container
export MADO_TEST_AZURE_URL=az://$container
ENV
  cat "$dir/env"
  ;;
stop)
  [ -f "$dir/azurite.pid" ] && kill "$(cat "$dir/azurite.pid")" 2>/dev/null || true
  ;;
*) echo "usage: azurite.sh start|stop DIR" >&2; exit 2 ;;
esac
