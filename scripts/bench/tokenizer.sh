#!/usr/bin/env bash
# Encode throughput, one thread: gptoss's tokenizer beside the reference (npm `tiktoken`, as used
# by tests/tools/o200k-oracle/o200k-oracle) on the same English text (Debian's license texts, ~210 KB).
#   scripts/bench/tokenizer.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
text=$(mktemp --suffix=.txt)
trap 'rm -f "$text"' EXIT
L=/usr/share/common-licenses
cat $L/Apache-2.0 $L/Artistic $L/BSD $L/GFDL-1.3 $L/GPL-1 $L/GPL-2 $L/GPL-3 $L/LGPL-2 \
    $L/LGPL-2.1 $L/LGPL-3 $L/MPL-1.1 $L/MPL-2.0 > "$text"
echo "gptoss (o200k_base.tiktoken):"
"$build/gptoss" tokenize-bench --file "$text" --seconds 5
oracle_modules="${XDG_CACHE_HOME:-$HOME/.cache}/o200k-oracle/node_modules"
if [[ -d $oracle_modules/tiktoken ]]; then
  echo "reference (npm tiktoken, node $(node --version)):"
  NODE_PATH="$oracle_modules" node scripts/bench/tiktoken_encode_bench.js "$text" 5
else
  echo "reference: run tests/tools/o200k-oracle/o200k-oracle once to install npm tiktoken"
fi
