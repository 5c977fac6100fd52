source tools/gpu/rounds/prelude.sh
ts tests
t v5 200 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups'
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for m in 120b 20b; do
  timeout 100 $g bench-kernels --model $m --tokens 2048 --iters 5 > $out/bk_$m.txt 2>&1
  grep -E "gate_up|down" $out/bk_$m.txt | grep -E "v5" >> $S
done
timeout 100 $g bench-kernels --model 120b --tokens 512 --iters 5 > $out/bk_120b_512.txt 2>&1
grep -E "gate_up \+ down" $out/bk_120b_512.txt | grep -E "v3 m64|v5" | grep fragments >> $S
ts pp
for m in 120b 20b; do
  timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" >> $S
done
ts spec-rep-c8-loop
json='{"id": 17, "name": "widget", "tags": ["a", "b", "c"], "price": 12.5, "in_stock": true}'
for i in 1 2 3 4; do echo "Repeat this JSON object exactly 20 times, one per line, nothing else: $json (copy $i)"; done > $out/prompts.txt
port=18300
for k in 0 1 3; do
  spec=(); [ $k -gt 0 ] && spec=(--speculative-config "{\"method\":\"ngram\",\"num_speculative_tokens\":$k,\"prompt_lookup_max\":4,\"prompt_lookup_min\":1}")
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights 120b --random-loop-tokens 64 --port $port --served-model-name m --max-model-len 4096 --max-num-seqs 8 "${spec[@]}" > $out/spec_serve_$k.log 2>&1 &
  pid=$!
  for _ in $(seq 150); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  timeout 120 $g bench-serve --base-url http://127.0.0.1:$port --model m --max-tokens 256 --ignore-eos --no-token-timing --prompts $out/prompts.txt --requests 16 --concurrency 8 --temperature 0 > $out/spec_bench_$k.txt 2>&1
  echo "K=$k: $(grep -E '^decode per stream|acceptance|^aggregate' $out/spec_bench_$k.txt | tr '\n' ' ')" >> $S
  kill -INT $pid; wait $pid; grep "cuda timeline" $out/spec_serve_$k.log >> $S
  port=$((port+1))
done
ts done
cat $S
