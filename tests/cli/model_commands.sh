#!/usr/bin/env bash
# Usage: model_commands.sh GPTOSS TESTDATA. Prints "N passed, N failed".
set -u
bin=$1 data=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $1"; fi; }

# make-model: same seed, identical files; the result loads and generates.
"$bin" make-model --preset tiny --out "$tmp/a" --seed 3 --shard-gb 0.05 >/dev/null
"$bin" make-model --preset tiny --out "$tmp/b" --seed 3 --shard-gb 0.05 >/dev/null
check "make-model is deterministic" 'diff -r "$tmp/a" "$tmp/b" >/dev/null'
check "make-model writes shards and an index" '[ $(ls "$tmp/a"/model-*-of-*.safetensors | wc -l) -ge 2 ] && [ -f "$tmp/a/model.safetensors.index.json" ]'
out=$("$bin" generate --model "$tmp/a" --prompt-ids 1,2,3 --max-tokens 4 2>"$tmp/text")
check "generate on a made model prints 4 ids ($out)" '[[ "$out" =~ ^[0-9]+,[0-9]+,[0-9]+,[0-9]+$ ]]'

check "generate prints the text of a made model's tokens" '[ -s "$tmp/text" ]'
out=$("$bin" generate --model "$tmp/a" --prompt "Hello world" --max-tokens 2 2>/dev/null)
check "generate --prompt tokenizes text ($out)" '[[ "$out" =~ ^[0-9]+,[0-9]+$ ]]'
check "make-model writes tokenizer.json" '[ -s "$tmp/a/tokenizer.json" ]'

# generate on the fixture reproduces transformers' greedy continuation of prompt 0.
fx="$data/tiny-gptoss"
want=$(grep -o '"greedy_continuations": \[\[[0-9, ]*\]' "$fx/golden.json" | grep -o '\[[0-9, ]*\]$' | tr -d '[] ')
p0=$(grep -o '"prompts": \[\[[0-9, ]*\]' "$fx/golden.json" | grep -o '\[[0-9, ]*\]$' | tr -d '[] ')
got=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 16)
check "generate greedy == transformers ($got vs $want)" '[ "$got" = "$want" ]'
s1=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 8 --temperature 0.8 --seed 5)
s2=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 8 --temperature 0.8 --seed 5)
check "same seed, same sample" '[ "$s1" = "$s2" ]'

# logits writes [n, vocab] float32.
"$bin" logits --model "$fx" --prompt-ids 5,6,7 --out "$tmp/l.safetensors" >/dev/null
check "logits file has the right size" '[ $(stat -c %s "$tmp/l.safetensors") -gt $((3*512*4)) ]'
check "logits header names the shape" 'head -c 200 "$tmp/l.safetensors" | grep -q "\"shape\":\[3,512\]"'

# Errors: one clear line, exit 1, no crash.
err() { "$@" >/dev/null 2>"$tmp/err"; rc=$?; [ $rc -eq 1 ] && grep -q "^error: " "$tmp/err"; }
check "missing model dir" 'err "$bin" logits --model /nonexistent --prompt-ids 1 --out "$tmp/x"'
check "bad prompt ids" 'err "$bin" logits --model "$fx" --prompt-ids 1,x --out "$tmp/x"'
check "--mxfp4-layers on the CPU" 'err "$bin" generate --model "$fx" --prompt-ids 1 --max-tokens 1 --mxfp4-layers qkv,o && grep -q "CUDA option" "$tmp/err"'
check "--mxfp4-layers with an unknown name" 'err "$bin" generate --model "$fx" --prompt-ids 1 --max-tokens 1 --mxfp4-layers qkv,mlp && grep -q "unknown layer \"mlp\"" "$tmp/err"'
check "--mxfp4-layers experts is the default" '"$bin" generate --model "$fx" --prompt-ids 1 --max-tokens 1 --mxfp4-layers experts >/dev/null 2>&1'
check "token outside vocab" 'err "$bin" generate --model "$fx" --prompt-ids 100000 --max-tokens 1'
cp -r "$fx" "$tmp/broken"; truncate -s 1000 "$tmp/broken"/model-00000-of-00000.safetensors
check "truncated shard" 'err "$bin" logits --model "$tmp/broken" --prompt-ids 1 --out "$tmp/x" && grep -q "model-00000-of-00000.safetensors" "$tmp/err"'
check "unknown preset" 'err "$bin" make-model --preset 7b --out "$tmp/c"'

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
