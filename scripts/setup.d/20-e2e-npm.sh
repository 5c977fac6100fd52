#!/usr/bin/env bash
# Installs the end-to-end tests' npm packages (the official `openai` client, pinned in
# tests/e2e/package-lock.json) into tests/e2e/node_modules.
set -euo pipefail
cd "$(dirname "$0")/../../tests/e2e"
want=$(node -p "require('./package-lock.json').packages['node_modules/openai'].version")
have=$(node -p "try { require('./node_modules/openai/package.json').version } catch { '' }" 2>/dev/null || true)
if [[ $have == "$want" ]]; then
  exit 0
fi
echo "setup: installing tests/e2e npm packages (openai@$want)"
npm ci --no-audit --no-fund --silent
