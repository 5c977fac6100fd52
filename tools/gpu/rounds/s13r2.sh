source tools/gpu/rounds/prelude.sh
ts pp20b
for v in v5 v3; do
  GPTOSS_EXPERT_GEMM=$v timeout 100 $g bench --device cuda --random-weights 20b --pp 512,2048,4096 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/$v /" >> $S
done
GPTOSS_EXPERT_GEMM=v5 GPTOSS_EXPERT_GEMM_V5_N=64 timeout 100 $g bench --device cuda --random-weights 20b --pp 2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/v5n64 /" >> $S
ts spec-rep-c8
json='{"id": 17, "name": "widget", "tags": ["a", "b", "c"], "price": 12.5, "in_stock": true}'
for i in 1 2 3 4; do echo "Repeat this JSON object exactly 20 times, one per line, nothing else: $json (copy $i)"; done > $out/prompts.txt
port=18300
for k in 0 1 3; do
  spec=(); [ $k -gt 0 ] && spec=(--speculative-config "{\"method\":\"ngram\",\"num_speculative_tokens\":$k,\"prompt_lookup_max\":4,\"prompt_lookup_min\":1}")
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights 120b --port $port --served-model-name m --max-model-len 4096 --max-num-seqs 8 "${spec[@]}" > $out/spec_serve_$k.log 2>&1 &
  pid=$!
  for _ in $(seq 150); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  timeout 120 $g bench-serve --base-url http://127.0.0.1:$port --model m --max-tokens 256 --ignore-eos --no-token-timing --prompts $out/prompts.txt --requests 16 --concurrency 8 --temperature 0 > $out/spec_bench_$k.txt 2>&1
  echo "K=$k: $(grep -E '^decode per stream|acceptance|^aggregate' $out/spec_bench_$k.txt | tr '\n' ' ')" >> $S
  kill -INT $pid; wait $pid; grep "cuda timeline" $out/spec_serve_$k.log >> $S
  port=$((port+1))
done
ts done
cat $S
