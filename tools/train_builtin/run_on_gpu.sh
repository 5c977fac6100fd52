#!/usr/bin/env bash
# Trains the built-in model on a GPU machine and writes everything it returns under $OUT:
#   gptoss-builtin.safetensors  the compact artifact  -> models/builtin/
#   train_log.txt               this script's output  -> models/builtin/TRAINING_LOG.txt
#   samples.json                greedy replies of the trained model (ids), for reading
#   golden.json, golden_logits.safetensors  transformers' outputs -> tests/data/builtin-golden/
# Needs .train-data/ (bash tools/train_builtin/make_data.sh, on a Debian machine) and python3
# with torch (CUDA), numpy and transformers. Bounded in time: about 4-5 minutes, 9 at most (run it with a 600 s limit).
#   OUT=/some/dir bash tools/train_builtin/run_on_gpu.sh [extra train.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
exec > >(tee "$OUT/train_log.txt") 2>&1
here=tools/train_builtin
py=${PYTHON:-python3}
echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$py" - <<'PY'
import sys, torch, numpy, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__,
      "transformers", transformers.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "-")
import os
if not torch.cuda.is_available() and os.environ.get("GPTOSS_TRAIN_ALLOW_CPU") != "1":
    sys.exit("no CUDA device: refusing to train on the CPU (GPTOSS_TRAIN_ALLOW_CPU=1 for a dry run)")
PY
for f in vocab.json tokens.u16 mask.u8 starts.u32 golden_prompts.json meta.json; do
  [ -s ".train-data/$f" ] || { echo "missing .train-data/$f: run make_data.sh and carry .train-data" >&2; exit 1; }
done
echo "data: $(cat .train-data/meta.json | tr -d '\n ')"
status=0
timeout 330 "$py" $here/train.py --data .train-data --out "$OUT" --work /tmp/train_builtin --seed 0 "$@" || status=$?
if [ $status -ne 0 ]; then echo "FAILED: train.py exited with $status" >&2; exit $status; fi
timeout 200 "$py" $here/golden.py "$OUT/gptoss-builtin.safetensors" .train-data/golden_prompts.json "$OUT" || status=$?
if [ $status -ne 0 ]; then echo "FAILED: golden.py exited with $status (the artifact is still in \$OUT)" >&2; fi
ls -la "$OUT"
exit $status
