# Session 43, round 1: the int8 screen of lm_head for greedy passes of 1-8 rows (lm_head_screen.cu,
# compiled here, never run on a GPU), and the sampler paths of session 42 (s42r1's tests, never run
# either). The screen against argmax_rows over the full skinny kernel (ids and every recomputed
# logit bit for bit; real vocabulary, awkward sizes, ties, the non-finite fallback), the model's
# greedy steps with and without it (2-layer 120b shapes, also checked against the CPU), sanitizers;
# then bench-kernels' lm_head greedy rows at 1 and 8 tokens (full bf16 copy + argmax_rows against
# the screen; the pairs it recomputes a step). SkinnyDense re-checks the fp8 packer, which now shares
# its byte loop with the int8 one.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" EXTRA_BINS=build/tests/engine/bench_engine_host tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t screen 400 $K --gtest_filter='Kernels.LmHeadScreen*:Kernels.SkinnyDense'
grep -E "^lm_head screen" $out/screen.log | head -12 >> $S
t sampler 120 $K --gtest_filter='Kernels.SampleRows*'
t model 400 $bin/test_cuda_model --gtest_filter='*TwoLayers120b*:*PipelinedGreedy*:*BatchedDecode*:*BatchInvariantDecode*:*GraphReplay*'
grep -E "^lm_head screen|greedy equal" $out/model.log | head -8 >> $S
t spec 200 $bin/test_cuda_spec --gtest_filter='*Verify*'
sanitize 'Kernels.LmHeadScreen*:Kernels.SampleRows*' memcheck racecheck synccheck
ts "bench-kernels: lm_head greedy, 120b shapes"
for tok in 1 8; do
  # (grep stops bench-kernels after lm_head's seven lines: the MoE rows come after them)
  timeout 150 $g bench-kernels --model 120b --tokens $tok --iters 50 2>&1 |
    grep -m 7 -E "lm_head greedy|lm_head screen|\| lm_head \|.*skinny_mma bf16" >> $S
done
ts done
