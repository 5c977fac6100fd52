# Session 43, round 1: the int8 screen of lm_head for greedy passes of 1-8 rows (lm_head_screen.cu,
# compiled here, never run on a GPU). The screen against argmax_rows over the full skinny kernel
# (ids and every recomputed logit bit for bit; real vocabulary, awkward sizes, a tie, the
# non-finite fallbacks, the sampler's rule at -inf); the model's greedy steps with and without it
# (2-layer 120b shapes, pipelined greedy and temperature-0 forward_sample, also checked against the
# CPU); then bench-kernels' lm_head greedy rows at 1 and 8 tokens (the full bf16 copy +
# argmax_rows against the screen at 1-4 chunks in flight; the pairs it recomputes a step).
# Sanitizers and the fp8 packer's re-check (it now shares its byte loop with the int8 one): s43r4.
# Session 42's sampler paths: s42r1 (same pack).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" EXTRA_BINS=build/tests/engine/bench_engine_host tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t screen 200 $K --gtest_filter='Kernels.LmHeadScreen*'
grep -E "^lm_head screen" $out/screen.log | head -14 >> $S
t model 300 $bin/test_cuda_model --gtest_filter='*TwoLayers120b*:*PipelinedGreedy*'
grep -E "^lm_head screen|greedy equal" $out/model.log | head -10 >> $S
ts "bench-kernels: lm_head greedy, 120b shapes"
for tok in 1 8; do
  # (grep stops bench-kernels after lm_head's seven lines: the MoE rows come after them)
  timeout 100 $g bench-kernels --model 120b --tokens $tok --iters 50 2>&1 |
    grep -m 7 -E "lm_head greedy|lm_head screen|\| lm_head \|.*skinny_mma bf16" >> $S
done
ts done
