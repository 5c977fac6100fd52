# Session 18, round 4: main's final binaries (async scheduling on by default, the engine thread
# spinning through the pass it waits for on a GPU). test_cuda_model and test_cuda_spec (the
# engine and the CUDA backend together); serve with the default against --no-async-scheduling
# (20b at 32 twice and 64, 120b at 32 and 64); bench-kernels' decode expert shapes at 20b, 64 tokens.
source tools/gpu/rounds/prelude.sh
t test_cuda_model 300 $bin/test_cuda_model
t test_cuda_spec 200 $bin/test_cuda_spec
for m in 20b 120b; do for flag in "" --no-async-scheduling; do
  ts $m $flag; serve_up $m $flag
  ts 32; bench_c 32; [ $m = 20b ] && { ts 32 again; bench_c 32; }; ts 64; bench_c 64
  serve_down
done; done
ts bench-kernels 20b 64
timeout 120 $g bench-kernels --model 20b --tokens 64 --iters 50 2>&1 | grep -E "experts (gate_up|down)" >> $S
ts done
rm -f $out/*.log
cat $S
