# Session 17, round 3 (same binaries as round 2; the fold off, as on main): the kernel tests round 2
# did not reach, the model tests, and serving at 32/64 streams with and without per-token logprobs
# (bench-serve asks for them by default to time each token; what do they cost the server?).
source tools/gpu/rounds/prelude.sh
ts kernel tests, rest
rest="Kernels.AttentionDecodeStoredMatchesFused:Kernels.AttentionDecodeFusedMatchesTwoKernels:Kernels.FlashAttention*:ExpertGemmV5Width.*:DecodeAttentionPlan.*:DenseGemmChoice.*:CublasLt.*:Kernels.RmsNorm:Kernels.Embed:Kernels.LinearMxfp4Dense:Kernels.StreamKRepeatsBitForBit:Kernels.ExpertGemmV5Preferred:Kernels.ExpertGemmV3TileRows:Kernels.WgmmaDenseTileLayout:Kernels.SkinnyUnits*:Kernels.MoeRoute*:Kernels.MoeCombine*:Kernels.RouterRoute*:Kernels.Argmax:Kernels.SampleRows*"
t kernels_rest 200 $K --gtest_filter="$rest"
grep -E "^\[==========\]" $out/kernels_rest.log | tail -1 >> $S
ts model
t model 200 $bin/test_cuda_model
for m in 20b 120b; do
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $m --port 18000 --max-model-len 8192 --max-num-seqs 64 > $out/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 150); do curl -sf localhost:18000/health >/dev/null && break; sleep 1; done
  cs="32 64"; [ $m = 120b ] && cs="32"
  for c in $cs; do for tt in "" --no-token-timing; do
    ts "serve $m $c streams $tt"
    timeout 100 $g bench-serve --base-url http://127.0.0.1:18000 --requests $((c * 2)) --concurrency $c --input-len 512 \
      --output-len 256 --ignore-eos $tt 2>&1 | grep -E "^TTFT|^aggregate|first error" >> $S
  done; done
  kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve.log >> $S
done
ts done
rm -f $out/*.log
cat $S
