#!/bin/bash
# TTFT of a multi-turn chat's second turn with a ~4k-token shared prefix, with and without
# prefix caching, on a running `gptoss serve` (docs/BENCHMARKS.md).
# usage: scripts/bench/prefix_cache.sh [PORT] [REPEATS]
# e.g.   build-cpu/gptoss serve --port 18977 --max-model-len 8192 [--no-enable-prefix-caching] &
#        scripts/bench/prefix_cache.sh 18977 5
# Turn 1 sends a ~3,950-token user message (max_tokens 16); each turn 2 sends that message,
# turn 1's answer and a new question with max_tokens 1, so its request time is its TTFT.
set -euo pipefail
PORT=${1:-8000}
REPEATS=${2:-5}
URL=http://127.0.0.1:$PORT/v1/chat/completions
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP" <<'PY'
import json, random, sys
random.seed(1)
w = ['alpha', 'beta', 'gamma', 'delta', 'river', 'stone', 'cloud', 'maple', 'orbit', 'pixel']
long = ' '.join(random.choice(w) for _ in range(3900))
open(sys.argv[1] + '/long.txt', 'w').write(long)
json.dump({'messages': [{'role': 'user', 'content': long}], 'max_tokens': 16, 'temperature': 0},
          open(sys.argv[1] + '/t1.json', 'w'))
PY
curl -sf -o "$TMP/r1.json" -w "turn 1: %{time_total} s\n" -H 'Content-Type: application/json' -d @"$TMP/t1.json" "$URL"
for i in $(seq "$REPEATS"); do
  python3 - "$TMP" "$i" <<'PY'
import json, sys
d = sys.argv[1]
long = open(d + '/long.txt').read()
answer = json.load(open(d + '/r1.json'))['choices'][0]['message'].get('content') or ''
msgs = [{'role': 'user', 'content': long}, {'role': 'assistant', 'content': answer},
        {'role': 'user', 'content': 'and now question number %s?' % sys.argv[2]}]
json.dump({'messages': msgs, 'max_tokens': 1, 'temperature': 0}, open(d + '/t2.json', 'w'))
PY
  t=$(curl -sf -o "$TMP/r2.json" -w "%{time_total}" -H 'Content-Type: application/json' -d @"$TMP/t2.json" "$URL")
  python3 -c "import json,sys; u=json.load(open(sys.argv[1]))['usage']; print('turn 2 (%s): TTFT %s s, prompt_tokens %d, cached_tokens %d' % (sys.argv[2], sys.argv[3], u['prompt_tokens'], u['prompt_tokens_details']['cached_tokens']))" "$TMP/r2.json" "$i" "$t"
done
curl -sf "http://127.0.0.1:$PORT/metrics" | grep '^gptoss:prefix_cache' || true
