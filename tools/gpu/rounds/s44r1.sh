# Session 44, round 1: every correctness check still waiting for a GPU in one call (a machine start
# is scarce): session 43's lm_head screen (s43r1's tests; s43r4's sanitizers and the fp8 packer's
# re-check) and session 42's device sampler (s42r1's tests and sanitizers), then s43r1's
# bench-kernels rows while time is left. Same pack as s43r1 (adc7c9d).
source tools/gpu/rounds/prelude.sh
ts tests
t screen 200 $K --gtest_filter='Kernels.LmHeadScreen*'
grep -E "^lm_head screen" $out/screen.log | head -14 >> $S
t model 300 $bin/test_cuda_model --gtest_filter='*TwoLayers120b*:*PipelinedGreedy*'
grep -E "^lm_head screen|greedy equal" $out/model.log | head -10 >> $S
left 330 && t sampler 120 $K --gtest_filter='Kernels.SampleRows*'
left 300 && t skinny 120 $K --gtest_filter='Kernels.SkinnyDense'
left 330 && sanitize 'Kernels.LmHeadScreen*:Kernels.SampleRows*' memcheck
left 400 && sanitize 'Kernels.LmHeadScreen*:Kernels.SampleRows*' racecheck
ts "bench-kernels: lm_head greedy, 120b shapes"
for tok in 1 8; do
  left 450 && timeout 80 $g bench-kernels --model 120b --tokens $tok --iters 50 2>&1 |
    grep -m 7 -E "lm_head greedy|lm_head screen|\| lm_head \|.*skinny_mma bf16" >> $S
done
ts done
