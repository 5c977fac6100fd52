#!/usr/bin/env bash
# Puts what run_on_gpu.sh returned where the repository keeps it, and prints the samples:
#   bash tools/train_builtin/install_results.sh DIR [GPTOSS_BINARY]
# DIR holds gptoss-builtin.safetensors, golden.json, golden_logits.safetensors, train_log.txt,
# samples.json. Then: build, `ctest -R 'Builtin|e2e'`, and commit models/builtin and
# tests/data/builtin-golden.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=${1:?usage: install_results.sh DIR [GPTOSS_BINARY]}
g=${2:-build-cpu/gptoss}
for f in gptoss-builtin.safetensors golden.json golden_logits.safetensors train_log.txt samples.json; do
  [ -s "$src/$f" ] || { echo "install_results: $src/$f is missing" >&2; exit 1; }
done
mkdir -p models/builtin tests/data/builtin-golden
cp "$src/gptoss-builtin.safetensors" models/builtin/
cp "$src/train_log.txt" models/builtin/TRAINING_LOG.txt
cp "$src/golden.json" "$src/golden_logits.safetensors" tests/data/builtin-golden/
ls -la models/builtin tests/data/builtin-golden
if [ -x "$g" ]; then
  echo "== greedy replies of the trained model (samples.json)"
  python3 -c 'import json,sys
for s in json.load(open(sys.argv[1])): print(json.dumps(s["completion"]))' "$src/samples.json" | "$g" tokenize --decode
fi
