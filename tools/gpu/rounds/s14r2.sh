source tools/gpu/rounds/prelude.sh
ts model-tests
t model 300 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
ts kernels
for spec in "20b 2048" "20b 512" "120b 8192"; do
  set -- $spec
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 5 > $out/bk_$1_$2.txt 2>&1
  grep -E "gate_up \+ down" $out/bk_$1_$2.txt | grep -E "v5" | grep -v checkpoint | sed "s/^/$1 $2 /" >> $S
done
ts pp
for m in 120b 20b; do
  timeout 150 $g bench --device cuda --random-weights $m --pp 512,2048,8192 --tg '' --runs 3 2>&1 | grep -E "^\| random" >> $S
  GPTOSS_CUDA_PROFILE=1 timeout 100 $g bench --device cuda --random-weights $m --pp 2048 --tg '' --runs 4 > $out/prof_$m.txt 2>&1
done
ts ttft
$g serve --device cuda --random-weights 120b --port 18120 --max-model-len 16384 > $out/serve_ttft.log 2>&1 &
pid=$!
for _ in $(seq 150); do curl -sf localhost:18120/health >/dev/null && break; sleep 1; done
for L in 2048 8192; do
  echo "ttft 120b $L" >> $S
  timeout 100 $g bench-serve --base-url http://127.0.0.1:18120 --input-len $L --output-len 1 --requests 4 --concurrency 1 2>&1 | grep -E "^TTFT|first error" >> $S
done
kill -INT $pid; wait $pid
ts serve
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
ts done
cat $S
