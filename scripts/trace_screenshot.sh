#!/usr/bin/env bash
# A screenshot of a `tools.profile` trace in a third-party viewer, headless: speedscope (npm,
# pinned) serves the Chrome trace from localhost and Debian's chromium renders its time-order
# view. (The Perfetto UI, which also opens these traces, is not reachable from machines without
# internet access; speedscope runs offline.)
# Usage: bash scripts/trace_screenshot.sh TRACE.json OUT.png [WIDTHxHEIGHT]
set -euo pipefail
TRACE=$(realpath "$1"); OUT=$(realpath -m "$2"); SIZE=${3:-1600x900}
WORK=$(mktemp -d); trap 'kill $SERVER 2>/dev/null || true; rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent speedscope@1.25.0 >/dev/null && tar xzf speedscope-1.25.0.tgz)
SITE="$WORK/package/dist/release"
cp "$TRACE" "$SITE/trace.json"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$SITE" >/dev/null 2>&1 & SERVER=$!
sleep 1
chromium --headless --no-sandbox --disable-dev-shm-usage --window-size="${SIZE/x/,}" --virtual-time-budget=15000 \
  --screenshot="$OUT" "http://127.0.0.1:$PORT/index.html#profileURL=http://127.0.0.1:$PORT/trace.json&title=$(basename "$TRACE")" \
  >/dev/null 2>&1
echo "trace_screenshot: $OUT"
