#!/usr/bin/env bash
# Builds the console: protobuf code from proto/ into src/gen/, a type check, and the bundle into
# dist/ (committed: the server compiles dist/ into its binary, and cargo must not need node).
#
# usage: console/build.sh NPM_PREFIX BUF   (NPM_PREFIX holds console/package-lock.json's tools)
set -euo pipefail
NPM_PREFIX="$1" BUF="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="$NPM_PREFIX/node_modules/.bin"

rm -rf console/src/gen
PATH="$BIN:$PATH" "$BUF" generate --template console/buf.gen.yaml proto
# tsc and esbuild find the packages through a link to the tools' prefix (git-ignored).
ln -sfn "$NPM_PREFIX/node_modules" console/node_modules
"$BIN/tsc" -p console/tsconfig.json
mkdir -p console/dist
cp console/static/index.html console/static/app.css console/static/favicon.svg console/dist/
"$BIN/esbuild" console/src/main.ts --bundle --format=esm --target=es2022 --minify \
    --legal-comments=none --log-level=warning --outfile=console/dist/app.js
