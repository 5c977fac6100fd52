source tools/gpu/rounds/prelude.sh
ts spec-test
t spec 150 $bin/test_cuda_spec
ts spec-gate
json='{"id": 17, "name": "widget", "tags": ["a", "b", "c"], "price": 12.5, "in_stock": true}'
for i in 1 2 3 4; do echo "Repeat this JSON object exactly 20 times, one per line, nothing else: $json (copy $i)"; done > $out/prompts.txt
for s in 0 1 2 3; do ids=""; for j in $(seq 0 127); do ids="$ids${ids:+, }$((1000 + (s * 16 + j) % 64))"; done; echo "{\"prompt\": [$ids]}"; done > $out/loop.jsonl
port=18300
for m in 120b 20b; do for k in 0 1 3; do
  spec=(); [ $k -gt 0 ] && spec=(--speculative-config "{\"method\":\"ngram\",\"num_speculative_tokens\":$k,\"prompt_lookup_max\":4,\"prompt_lookup_min\":1}")
  $g serve --device cuda --random-weights $m --random-loop-tokens 64 --port $port --served-model-name m --max-model-len 4096 --max-num-seqs 8 "${spec[@]}" > $out/spec_serve_${m}_$k.log 2>&1 &
  pid=$!
  for _ in $(seq 150); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  B="$g bench-serve --base-url http://127.0.0.1:$port --model m --max-tokens 256 --ignore-eos --no-token-timing"
  timeout 120 $B --prompts $out/prompts.txt --requests 16 --concurrency 8 --temperature 0 > $out/b_${m}_${k}_c8.txt 2>&1
  timeout 120 $B --prompts $out/loop.jsonl --requests 4 --concurrency 1 --temperature 0 > $out/b_${m}_${k}_loop.txt 2>&1
  for w in c8 loop; do echo "$m K=$k $w: $(grep -E '^decode per stream|acceptance|^aggregate' $out/b_${m}_${k}_$w.txt | sed 's/(.*completion.*)//' | tr '\n' ' ')" >> $S; done
  curl -s localhost:$port/metrics | grep -E "^gptoss:spec_decode_num_(gated|draft)" | tr '\n' ' ' >> $S; echo >> $S
  kill -INT $pid; wait $pid
  port=$((port+1))
done; done
ts done
cat $S
