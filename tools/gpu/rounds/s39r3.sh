# Session 39, round 3 (prepared in the thirty-ninth session, which had no machine; not yet run):
# version 5's warp-specialized kernel (kernels/moe/expert_gemm_v5_ws.cu, GPTOSS_EXPERT_GEMM_V5_WS=1|2,
# opt-in): the 128-pair four-warpgroup tiles with every copy made by a producer warp (the activation
# rows by tensor copies (1) or cp.async (2), bulk copies of the weights) so the 16 other warps only decode and
# multiply; the thirty-seventh session's Nsight Compute put ~60 of the mbarrier kernel's ~240 warp
# instructions a K step on copies and their waits. Never run on a GPU before this round: first the
# version 5 tests (every width; each warp-specialized mode its own test, alone and in split tilings)
# and the sanitizers over them (~7 minutes: one call; the fortieth session moved the bench-kernels
# A/B to s39r5 so that the call stays under its 10 minutes); s39r5 has the bench-kernels and prefill
# A/B, s39r6 Nsight Compute (one call each).
# Pack: PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
# One process a mode (a faulting kernel poisons its context for the tests after it); cp.async first,
# the mode with the fewer unknowns. Every wait of the producer and the consumers' first traps after
# 20 s, and the host refuses a build whose registers cannot cover setmaxnreg's raises, so a broken
# pipeline costs a launch error, not the call's time.
t v5 200 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5'
for mode in CpAsync Tma; do
  t v5_$mode 120 $K --gtest_filter="Kernels.MoeMxfp4ExpertGemmV5WarpSpecialized$mode"
  grep -E "warp-specialized|Failure|error" $out/v5_$mode.log | head -6 >> $S
  sanitize "Kernels.MoeMxfp4ExpertGemmV5WarpSpecialized$mode" memcheck racecheck synccheck
done
ts done
