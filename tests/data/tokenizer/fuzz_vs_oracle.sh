#!/usr/bin/env bash
# Differential check, by hand (not a test): N random strings over many Unicode blocks and the
# special tokens, encoded by `gptoss tokenize` and by the reference o200k-oracle.
#   tests/data/tokenizer/fuzz_vs_oracle.sh build/gptoss tests/tools/o200k-oracle/o200k-oracle [N] [SEED]
set -euo pipefail
gptoss=$1 oracle=$2 n=${3:-6000} seed=${4:-99}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$n" "$seed" > "$tmp/in.jsonl" <<'PY'
import json, random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x250, 0x36f), (0x370, 0x4ff), (0x590, 0x6ff),
          (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x1e00, 0x206f), (0x2070, 0x2bff),
          (0x3000, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xacff), (0xf900, 0xfaff), (0xfe00, 0xffef),
          (0x10000, 0x1007f), (0x1d400, 0x1d7ff), (0x1f000, 0x1faff), (0x20000, 0x2000f)]
specials = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|reserved_200500|>"]
for _ in range(n):
    s = []
    for _ in range(rng.randint(1, 60)):
        r = rng.random()
        if r < 0.3:
            s.append(rng.choice(" \n\r\t'sdmltrve0123456789.,!?"))
        elif r < 0.33:
            s.append(rng.choice(specials))
        else:
            a, b = rng.choice(blocks)
            s.append(chr(rng.randint(a, b)))
    print(json.dumps({"text": "".join(s)}, ensure_ascii=False))
PY
"$oracle" < "$tmp/in.jsonl" > "$tmp/oracle"
"$gptoss" tokenize < "$tmp/in.jsonl" > "$tmp/gptoss"
if cmp -s "$tmp/oracle" "$tmp/gptoss"; then
  echo "fuzz: $n strings, all equal"
else
  diff "$tmp/oracle" "$tmp/gptoss" | head -20
  exit 1
fi
