#!/usr/bin/env bash
# gptoss tokenize / harmony-render / harmony-parse end to end.
#   tokenize_commands.sh GPTOSS TEST_DATA_DIR
set -euo pipefail
g=$1
data=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Encoding the corpus gives the reference ids (JSON lines in, JSON lines out).
"$g" tokenize < "$data/tokenizer/corpus.jsonl" > "$tmp/ids"
cmp "$tmp/ids" "$data/tokenizer/corpus.ids.jsonl" || fail "tokenize: ids differ from the reference"
# --decode then encode again gives the same ids.
"$g" tokenize --decode < "$data/tokenizer/corpus.ids.jsonl" > "$tmp/text"
"$g" tokenize < "$tmp/text" > "$tmp/ids2"
cmp "$tmp/ids2" "$data/tokenizer/corpus.ids.jsonl" || fail "tokenize --decode does not round trip"
# Plain JSON strings, blank lines, a .tiktoken path, --no-special.
tik="${GPTOSS_TIKTOKEN:-${XDG_CACHE_HOME:-$HOME/.cache}/gptoss/o200k_base.tiktoken}"
printf '"hello world"\n\n{"text": "<|start|>"}\n' | "$g" tokenize --tokenizer "$tik" > "$tmp/out"
[[ $(cat "$tmp/out") == $'[24912,2375]\n[200006]' ]] || fail "tokenize: got $(cat "$tmp/out")"
echo '"<|start|>"' | "$g" tokenize --no-special | grep -qv 200006 || fail "--no-special"
echo '[24912,2375]' | "$g" tokenize --decode | grep -qx '"hello world"' || fail "--decode"
# Errors: clear message, non-zero exit.
if echo '{"text": ' | "$g" tokenize 2> "$tmp/err"; then fail "bad JSON accepted"; fi
grep -q "line 1" "$tmp/err" || fail "bad JSON error: $(cat "$tmp/err")"
if echo '"x"' | "$g" tokenize --tokenizer /nonexistent 2> "$tmp/err"; then fail "bad path accepted"; fi
grep -q "/nonexistent" "$tmp/err" || fail "bad path error: $(cat "$tmp/err")"

# harmony-render: a one-question chat renders as the reference's test_simple_convo.txt.
echo '{"messages": [{"role": "user", "content": "What is 2 + 2?"}]}' | "$g" harmony-render > "$tmp/r"
printf '%s' "$(cat "$data/harmony/test_simple_convo.txt")" | cmp - <(printf '%s' "$(cat "$tmp/r")") ||
  fail "harmony-render differs from test_simple_convo.txt"
# harmony-render --jsonl: one request a line, one JSON string a line, each as rendered alone
# (the built-in model's training data is rendered this way); a bad line is named.
{ echo '{"messages": [{"role": "user", "content": "What is 2 + 2?"}]}'; echo;
  echo '{"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low"}'; } > "$tmp/reqs"
"$g" harmony-render --jsonl --request "$tmp/reqs" > "$tmp/rj"
[[ $(wc -l < "$tmp/rj") == 2 ]] || fail "harmony-render --jsonl: $(cat "$tmp/rj")"
[[ $(sed -n 1p "$tmp/rj") == "$(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read().rstrip("\n")))' "$tmp/r")" ]] ||
  fail "harmony-render --jsonl line 1 differs from the single render"
echo '{"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low"}' | "$g" harmony-render > "$tmp/r2"
[[ $(sed -n 2p "$tmp/rj") == "$(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read().rstrip("\n")))' "$tmp/r2")" ]] ||
  fail "harmony-render --jsonl line 2 differs from the single render"
printf '%s\n' '{"messages": []}' '{"messages": 5}' > "$tmp/bad"
if "$g" harmony-render --jsonl --request "$tmp/bad" > /dev/null 2> "$tmp/err"; then fail "bad --jsonl line accepted"; fi
grep -q "line [12]" "$tmp/err" || fail "harmony-render --jsonl error: $(cat "$tmp/err")"
# harmony-parse: the reference's sampled reasoning response.
tr -s ' \n' ',' < "$data/harmony/test_simple_reasoning_response.txt" | sed 's/^/[/; s/,$/]/' |
  "$g" harmony-parse > "$tmp/p"
[[ $(cat "$tmp/p") == '[{"role":"assistant","channel":"analysis","content":"User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer."},{"role":"assistant","channel":"final","content":"2 + 2 = 4."}]' ]] ||
  fail "harmony-parse: $(cat "$tmp/p")"
echo ok
