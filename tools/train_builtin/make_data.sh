#!/usr/bin/env bash
# Builds the built-in model's training data into .train-data/ (git-ignored through
# .git/info/exclude, see below) on a Debian machine:
#   bash tools/train_builtin/make_data.sh [GPTOSS_BINARY] [CONVERSATIONS]
# Needs the Debian packages dict-devil and bible-kjv (public-domain texts, see README.md) and a
# built gptoss (default build-cpu/gptoss): conversations are rendered by our own harmony
# renderer (`gptoss harmony-render --jsonl`) and tokenized by our tokenizer (`gptoss tokenize`).
# Deterministic: the same packages and seed give the same files.
set -euo pipefail
cd "$(dirname "$0")/../.."
g=${1:-build-cpu/gptoss}
count=${2:-30000}
here=tools/train_builtin
out=.train-data
[ -x "$g" ] || { echo "make_data: $g is not built" >&2; exit 1; }
for p in dict-devil bible-kjv; do
  dpkg -s "$p" >/dev/null 2>&1 || { echo "make_data: install the Debian package $p (apt-get install $p)" >&2; exit 1; }
done
# Keep the data out of git without touching .gitignore for a local folder.
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.train-data/' "$exclude" 2>/dev/null || echo '/.train-data/' >> "$exclude"
rm -rf "$out" && mkdir -p "$out"
python3 $here/extract_corpus.py > $out/corpus.jsonl
python3 $here/make_conversations.py --corpus $out/corpus.jsonl --out $out/conversations.jsonl --count "$count"
python3 -c 'import json,sys
for l in open(sys.argv[1]): print(json.dumps(json.loads(l)["request"]))' $out/conversations.jsonl > $out/requests.jsonl
"$g" harmony-render --jsonl --request $out/requests.jsonl > $out/prompts.jsonl
python3 $here/make_units.py $out/corpus.jsonl $out/conversations.jsonl $out/prompts.jsonl $out
"$g" tokenize < $out/texts.jsonl > $out/ids.jsonl
python3 $here/pack_data.py --dir $out
# Only what train.py and golden.py read travels to the GPU machine.
rm -f $out/corpus.jsonl $out/conversations.jsonl $out/requests.jsonl $out/prompts.jsonl $out/texts.jsonl $out/ids.jsonl $out/units.jsonl
du -sh $out
