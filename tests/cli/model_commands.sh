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
out=$("$bin" generate --model "$tmp/a" --prompt-ids 1,2,3 --max-tokens 4 --ignore-eos --print-ids 2>"$tmp/log")
check "generate --print-ids on a made model prints 4 ids ($out)" '[[ "$out" =~ ^[0-9]+,[0-9]+,[0-9]+,[0-9]+$ ]]'
check "generate reports its speed on stderr" 'grep -q "tokens generated in .* tok/s" "$tmp/log"'
check "loading prints what was read on stderr" 'grep -q "^read weights: .* in " "$tmp/log"'
"$bin" generate --model "$tmp/a" --prompt "Hello world" --max-tokens 4 --ignore-eos >"$tmp/text" 2>"$tmp/log"
check "generate prints the text (not ids) on stdout" '[ -s "$tmp/text" ] && ! grep -qE "^[0-9]+(,[0-9]+)+$" "$tmp/text" && ! grep -q "tok/s" "$tmp/text"'
# Streamed: the first text arrives while generation goes on (300 tokens, ~1 KB: less than a stdio
# buffer, so a block-buffered stdout would deliver it only at exit).
mkfifo "$tmp/fifo"
"$bin" generate --model "$tmp/a" --prompt "Hello" --max-tokens 300 --ignore-eos >"$tmp/fifo" 2>/dev/null & gpid=$!
exec 3<"$tmp/fifo"
head -c 1 <&3 >/dev/null
state=$(cut -d' ' -f3 /proc/$gpid/stat 2>/dev/null)  # running, not a zombie that has exited
alive=$([ -n "$state" ] && [ "$state" != Z ] && echo yes)
kill $gpid 2>/dev/null; exec 3<&-; wait $gpid 2>/dev/null
check "generate streams its text" '[ "$alive" = yes ]'
out=$("$bin" generate --model "$tmp/a" --prompt "Hello world" --max-tokens 2 --ignore-eos --print-ids 2>/dev/null)
check "generate --prompt tokenizes text ($out)" '[[ "$out" =~ ^[0-9]+,[0-9]+$ ]]'
check "make-model writes tokenizer.json" '[ -s "$tmp/a/tokenizer.json" ]'

# generate on the fixture reproduces transformers' greedy continuation of prompt 0.
fx="$data/tiny-gptoss"
want=$(grep -o '"greedy_continuations": \[\[[0-9, ]*\]' "$fx/golden.json" | grep -o '\[[0-9, ]*\]$' | tr -d '[] ')
p0=$(grep -o '"prompts": \[\[[0-9, ]*\]' "$fx/golden.json" | grep -o '\[[0-9, ]*\]$' | tr -d '[] ')
got=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 16 --print-ids 2>/dev/null)
check "generate greedy == transformers ($got vs $want)" '[ "$got" = "$want" ]'
s1=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 8 --temperature 0.8 --seed 5 --print-ids 2>/dev/null)
s2=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 8 --temperature 0.8 --seed 5 --print-ids 2>/dev/null)
check "same seed, same sample" '[ "$s1" = "$s2" ]'
# --top-k 1 and --min-p 1 keep only the most likely token: greedy at any temperature.
k1=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 16 --temperature 1.5 --top-k 1 --seed 5 --print-ids 2>/dev/null)
check "--top-k 1 is greedy ($k1)" '[ "$k1" = "$want" ]'
m1=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 16 --temperature 1.5 --min-p 1 --seed 5 --print-ids 2>/dev/null)
check "--min-p 1 is greedy ($m1)" '[ "$m1" = "$want" ]'
t1=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 16 --temperature 1.5 --seed 5 --print-ids 2>/dev/null)
check "without them, T=1.5 samples ($t1)" '[ "$t1" != "$want" ]'
# It stops at the model's eos (here made the third greedy token), unless --ignore-eos.
cp -r "$fx" "$tmp/eos"
third=$(echo "$want" | cut -d, -f3)
sed -i "s/\"eos_token_id\": [0-9]*/\"eos_token_id\": $third/" "$tmp/eos/config.json"
got=$("$bin" generate --model "$tmp/eos" --prompt-ids "$p0" --max-tokens 16 --print-ids 2>"$tmp/log")
check "generate stops at eos ($got)" '[ "$got" = "$(echo "$want" | cut -d, -f1-3)" ] && grep -q "stopped at" "$tmp/log"'
got=$("$bin" generate --model "$tmp/eos" --prompt-ids "$p0" --max-tokens 16 --print-ids --ignore-eos 2>/dev/null)
check "--ignore-eos goes on ($got)" '[ "$got" = "$want" ]'
txt=$("$bin" generate --model "$tmp/eos" --prompt-ids "$p0" --max-tokens 16 2>/dev/null)
full=$("$bin" generate --model "$tmp/eos" --prompt-ids "$p0" --max-tokens 2 2>/dev/null)
check "the text ends before the eos token ($txt vs $full)" '[ "$txt" = "$full" ]'

# logits writes [n, vocab] float32.
"$bin" logits --model "$fx" --prompt-ids 5,6,7 --out "$tmp/l.safetensors" >/dev/null
check "logits file has the right size" '[ $(stat -c %s "$tmp/l.safetensors") -gt $((3*512*4)) ]'
check "logits header names the shape" 'head -c 200 "$tmp/l.safetensors" | grep -q "\"shape\":\[3,512\]"'

# Errors: one clear line, exit 1, no crash.
err() { "$@" >/dev/null 2>"$tmp/err"; rc=$?; [ $rc -eq 1 ] && grep -q "^error: " "$tmp/err"; }
check "missing model dir" 'err "$bin" logits --model /nonexistent --prompt-ids 1 --out "$tmp/x"'
check "--mxfp4-layers on the CPU" 'err "$bin" generate --model "$fx" --prompt-ids 1 --max-tokens 1 --mxfp4-layers qkv,o && grep -q "CUDA option" "$tmp/err"'
check "--mxfp4-layers with an unknown name" 'err "$bin" generate --model "$fx" --prompt-ids 1 --max-tokens 1 --mxfp4-layers qkv,mlp && grep -q "unknown layer \"mlp\"" "$tmp/err"'
check "--mxfp4-layers experts is the default" '"$bin" generate --model "$fx" --prompt-ids 1 --max-tokens 1 --mxfp4-layers experts >/dev/null 2>&1'
check "token outside vocab" 'err "$bin" generate --model "$fx" --prompt-ids 100000 --max-tokens 1'
cp -r "$fx" "$tmp/broken"; truncate -s 1000 "$tmp/broken"/model-00000-of-00000.safetensors
check "truncated shard" 'err "$bin" logits --model "$tmp/broken" --prompt-ids 1 --out "$tmp/x" && grep -q "model-00000-of-00000.safetensors" "$tmp/err"'
# Usage errors: "error: OPTION: why", exit 2, before anything runs.
usage() { "$@" >/dev/null 2>"$tmp/err"; rc=$?; [ $rc -eq 2 ] && grep -q "^error: " "$tmp/err"; }
check "unknown preset" 'usage "$bin" make-model --preset 7b --out "$tmp/c" && grep -q "one of tiny, 20b, 120b" "$tmp/err"'
check "port out of range" 'usage "$bin" serve --port 99999 && grep -q "^error: --port: must be an integer from 0 to 65535" "$tmp/err"'
check "--pp abc" 'usage "$bin" bench --pp abc && grep -q "^error: --pp: must be a comma-separated list" "$tmp/err"'
check "--max-tokens 0" 'usage "$bin" generate --prompt-ids 1 --max-tokens 0 && grep -q "must be an integer >= 1 (got \"0\")" "$tmp/err"'
check "--layers 0" 'usage "$bin" make-model --layers 0 --out "$tmp/c" && [ ! -e "$tmp/c" ]'
check "--shard-gb 0" 'usage "$bin" make-model --shard-gb 0 --out "$tmp/c" && [ ! -e "$tmp/c" ]'
check "bad prompt ids" 'usage "$bin" logits --model "$fx" --prompt-ids 1,x --out "$tmp/x" && grep -q "^error: --prompt-ids: must be comma-separated token ids" "$tmp/err"'
check "a trailing comma in prompt ids" 'usage "$bin" generate --model "$fx" --prompt-ids 1,2, --max-tokens 1'
check "unknown command lists the commands" 'usage "$bin" foo && grep -q "unknown command \"foo\"" "$tmp/err" && grep -q "serve" "$tmp/err"'
check "--version" '"$bin" --version | grep -q "^gptoss [0-9]"'
check "help COMMAND" '"$bin" help serve | grep -q -- "--max-model-len"'
"$bin" make-model --preset tiny --layers 3 --out "$tmp/l3" --seed 1 >/dev/null
check "make-model --layers 3 writes 3 layers" 'grep -q "\"num_hidden_layers\": 3" "$tmp/l3/config.json" && "$bin" generate --model "$tmp/l3" --prompt-ids 1 --max-tokens 1 >/dev/null 2>&1'

# A loop model (make-model --loop-tokens): greedy generation walks the cycle of ids 1000..1005.
"$bin" make-model --preset tiny --loop-tokens 6 --out "$tmp/loop" --seed 2 >/dev/null
got=$("$bin" generate --model "$tmp/loop" --prompt-ids 1000,1001,1002 --max-tokens 8 --ignore-eos --print-ids 2>/dev/null | tr -s ' \n,' ' ' | sed 's/ *$//')
check "make-model --loop-tokens 6 cycles ($got)" '[ "$got" = "1003 1004 1005 1000 1001 1002 1003 1004" ]'
check "--random-loop-tokens needs --random-weights" 'err "$bin" generate --model "$tmp/loop" --random-loop-tokens 4 --prompt-ids 1 && grep -q "random-loop-tokens" "$tmp/err"'

# --random-weights with --prompt tokenizes with o200k_harmony (as serve does); on the CPU the
# error is then the backend's, not a missing tokenizer.
check "--random-weights --prompt gets to the backend" 'err "$bin" generate --random-weights tiny --prompt hi && grep -q "GPU" "$tmp/err" && ! grep -qi "tokenizer" "$tmp/err"'

# --model: a missing directory is named as such; a Hugging Face id is found in the local cache.
check "missing model dir named" 'err "$bin" generate --model /nonexistent --prompt hi && grep -q "model directory /nonexistent does not exist" "$tmp/err"'
hub="$tmp/hub/models--test-org--tiny-gptoss"
mkdir -p "$hub/snapshots" "$hub/refs"
cp -r "$fx" "$hub/snapshots/0123abcd"
echo -n 0123abcd > "$hub/refs/main"
got=$(HF_HUB_CACHE="$tmp/hub" "$bin" generate --model test-org/tiny-gptoss --prompt-ids "$p0" --max-tokens 16 --print-ids 2>/dev/null)
check "--model ORG/NAME from HF_HUB_CACHE ($got)" '[ "$got" = "$want" ]'
got=$(HF_HUB_CACHE= HF_HOME="$tmp" XDG_CACHE_HOME= "$bin" generate --model test-org/tiny-gptoss --prompt-ids "$p0" --max-tokens 16 --print-ids 2>/dev/null)
check "--model ORG/NAME from HF_HOME/hub ($got)" '[ "$got" = "$want" ]'
check "an id not in the cache names the paths tried" 'HF_HUB_CACHE="$tmp/hub" err "$bin" generate --model test-org/absent --prompt-ids 1 && grep -q "$tmp/hub/models--test-org--absent/snapshots" "$tmp/err" && grep -q "refs/main" "$tmp/err"'

# logits and bench run the built-in model without --model, as generate does.
check "logits without --model" '"$bin" logits --prompt-ids 1,2 --out "$tmp/b.safetensors" >/dev/null 2>&1 && [ -s "$tmp/b.safetensors" ]'
"$bin" bench --pp 8 --tg 2 --tg-prompt 4 --runs 1 >"$tmp/bench.txt" 2>/dev/null
check "bench without --model prints a table, no JSON" 'grep -q "| pp8 |" "$tmp/bench.txt" && ! grep -q "{" "$tmp/bench.txt"'
"$bin" bench --pp 8 --pp-batch 1,3 --tg "" --runs 1 >"$tmp/bench_ppb.txt" 2>/dev/null
check "bench --pp-batch prints ppN and ppN xB rows" 'grep -q "| pp8 |" "$tmp/bench_ppb.txt" && grep -q "| pp8 x3 |" "$tmp/bench_ppb.txt"'
check "--pp-batch 0" 'usage "$bin" bench --pp-batch 0'
"$bin" bench --pp 8 --tg "" --runs 1 --json - >"$tmp/bench.json" 2>"$tmp/bench.err"
check "bench --json - prints only JSON on stdout" 'python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j[\"results\"][0][\"test\"]==\"pp8\"" "$tmp/bench.json" && grep -q "| pp8 |" "$tmp/bench.err"'
"$bin" bench --pp 8 --tg "" --runs 1 --json "$tmp/b2.json" >"$tmp/bench.txt" 2>/dev/null
check "bench --json FILE writes the file, the table to stdout" 'python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/b2.json" && grep -q "| pp8 |" "$tmp/bench.txt"'

# bench-serve against no server: one line saying so.
check "bench-serve, connection refused" 'err "$bin" bench-serve --base-url http://127.0.0.1:1 --requests 1 && grep -q "connection refused to 127.0.0.1:1" "$tmp/err"'

# serve refuses a context it cannot hold, at start.
check "serve --kv-cache-tokens 10" 'err "$bin" serve --port 0 --kv-cache-tokens 10 && grep -q "holds 16 tokens" "$tmp/err"'
check "serve --max-model-len above the model" 'err "$bin" serve --port 0 --max-model-len 200000 && grep -q "max_position_embeddings (131072)" "$tmp/err"'
check "serve --max-model-len above the KV cache" 'err "$bin" serve --port 0 --max-model-len 8192 --kv-cache-tokens 4096 && grep -q "which holds 4096 tokens" "$tmp/err"'

# serve's start-up summary, and the name of a model given as DIR/ or as a Hugging Face id.
serve_banner() {  # serve_banner LOG ARGS...: starts serve, waits for its summary, stops it
  local log=$1; shift
  "$@" --port 0 >/dev/null 2>"$log" & local pid=$!
  for _ in $(seq 600); do grep -q "max_model_len" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
}
serve_banner "$tmp/s1" "$bin" serve --model "$tmp/a/" --max-model-len 1024 --kv-cache-tokens 4096
check "serve --model DIR/ is served as DIR" 'grep -q "model a (cpu" "$tmp/s1"'
check "the summary: KV dtype and tokens" 'grep -q "KV cache: bf16 (held as f32 on the CPU), 4096 tokens (256 pages of 16)" "$tmp/s1"'
check "the summary: sequences at max_model_len" 'grep -q "max_model_len 1024: room for 4.00 sequences of 1024 tokens" "$tmp/s1"'
check "the summary: the CPU's default token budget" 'grep -q "max_num_batched_tokens 2048" "$tmp/s1"'
HF_HUB_CACHE="$tmp/hub" serve_banner "$tmp/s2" "$bin" serve --model test-org/tiny-gptoss --kv-cache-dtype fp8 --max-model-len 64 --max-num-batched-tokens 512
check "serve --model ORG/NAME is served as ORG/NAME" 'grep -q "model test-org/tiny-gptoss (cpu" "$tmp/s2" && grep -q "KV cache: fp8" "$tmp/s2"'
check "serve --max-num-batched-tokens N is the budget" 'grep -q "max_num_batched_tokens 512" "$tmp/s2"'

# Eagle3 heads: make-model writes the published layout; serve drafts with one (CPU backend).
"$bin" make-model --preset eagle3-tiny --no-embed --out "$tmp/e1" --seed 2 >/dev/null
"$bin" make-model --preset eagle3-tiny --no-embed --out "$tmp/e2" --seed 2 >/dev/null
check "make-model eagle3 is deterministic" 'diff -r "$tmp/e1" "$tmp/e2" >/dev/null'
check "make-model eagle3 writes an Eagle3 config" 'grep -q LlamaForCausalLMEagle3 "$tmp/e1/config.json" && grep -q "\"draft_vocab_size\": 512" "$tmp/e1/config.json"'
check "--no-embed is for Eagle3 heads" 'err "$bin" make-model --preset tiny --no-embed --out "$tmp/c" && grep -q "Eagle3" "$tmp/err"'
"$bin" serve --port 0 --model "$tmp/a" --max-model-len 256 --kv-cache-tokens 4096 \
  --speculative-config "{\"method\":\"eagle3\",\"model\":\"$tmp/e1\",\"num_speculative_tokens\":2}" >/dev/null 2>"$tmp/s3" & spid=$!
for _ in $(seq 600); do grep -q "speculative decoding" "$tmp/s3" && break; kill -0 $spid 2>/dev/null || break; sleep 0.1; done
kill $spid 2>/dev/null; wait $spid 2>/dev/null
check "serve with an eagle3 head" 'grep -q "speculative decoding: eagle3 head $tmp/e1, up to 2 draft tokens" "$tmp/s3"'
check "serve with an eagle3 head of another model" 'err "$bin" serve --port 0 --model "$fx" --speculative-model "$tmp/e1" && grep -q "target hidden size of 128" "$tmp/err"'
check "--profile plain with --speculative-model" 'err "$bin" serve --port 0 --profile plain --speculative-model "$tmp/e1" && grep -q "profile plain" "$tmp/err"'
check "eagle3 head directory missing" 'err "$bin" serve --port 0 --speculative-model /nonexistent/head && grep -q "not an Eagle3 head directory" "$tmp/err"'
# Tensor parallelism on the CPU: the fixture's greedy continuation (transformers') at TP 2 and 4.
got=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 16 --print-ids --tp 2 2>/dev/null)
check "generate --tp 2 greedy == transformers ($got)" '[ "$got" = "$want" ]'
got=$("$bin" generate --model "$fx" --prompt-ids "$p0" --max-tokens 16 --print-ids --tp 4 --tp-expert-sharding expert 2>/dev/null)
check "generate --tp 4 --tp-expert-sharding expert greedy == transformers ($got)" '[ "$got" = "$want" ]'
check "--tp 4 splits 2 blocks of 32 no further" 'err "$bin" generate --model "$fx" --prompt-ids 1 --tp 4 && grep -q "use --tp-expert-sharding expert" "$tmp/err"'
serve_banner "$tmp/s4" "$bin" serve --model "$fx" --tp 2 --max-model-len 64
check "serve --tp 2 says so" 'grep -q "tensor parallel: 2 ranks, one thread each, experts split by intermediate" "$tmp/s4"'
# Two serve processes from torchrun-style variables: rank 1 serves rank 0's passes (no HTTP);
# rank 0 stopping (SIGTERM) stops it cleanly.
# The port below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default): there a
# concurrent test's outgoing connection may hold it for longer than rank 0's 5 s of bind retries.
port=$(( 20000 + RANDOM % 12000 ))
tp="MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2"  # env execs gptoss: $! is its pid
env $tp RANK=1 "$bin" serve --model "$fx" --tp 2 --port 0 >"$tmp/w.out" 2>"$tmp/w.err" & wpid=$!
env $tp RANK=0 "$bin" serve --model "$fx" --tp 2 --max-model-len 64 --port 0 >/dev/null 2>"$tmp/r0.err" & rpid=$!
for _ in $(seq 600); do grep -q "max_model_len" "$tmp/r0.err" && break; kill -0 $rpid 2>/dev/null || break; sleep 0.1; done
kill $rpid 2>/dev/null; wait $rpid 2>/dev/null
for _ in $(seq 300); do kill -0 $wpid 2>/dev/null || break; sleep 0.1; done
kill -9 $wpid 2>/dev/null  # a worker left running is a failure below, not a hung test
wait $wpid; wrc=$?
fail_before=$fail
check "serve as rank 0 of 2 processes" 'grep -q "one process each (torchrun, rank 0 at 127.0.0.1:$port), this is rank 0" "$tmp/r0.err"'
check "serve as rank 1 serves no HTTP and stops with rank 0 (rc $wrc)" '[ $wrc -eq 0 ] && grep -q "rank 1/2: ready" "$tmp/w.err" && ! grep -q "http://" "$tmp/w.err"'
if [ $fail -gt $fail_before ]; then  # either of the two: what each rank said
  echo "--- rank 0 stderr:"; tail -20 "$tmp/r0.err"; echo "--- rank 1 stderr:"; tail -20 "$tmp/w.err"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
