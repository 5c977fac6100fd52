# Session 40, round 1: version 5's warp-specialized kernel with the producer warpgroup's four warps
# copying (s39r5 measured one producer warp 3.2-4.7x slower than the mbarrier kernel: it could not
# issue a step's copies in a step's MMA time). Tests of both copy modes and racecheck of both, then
# bench-kernels A/B against the mbarrier kernel (120b at 4096 and 8192 tokens; ~5 minutes).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
for mode in CpAsync Tma; do
  t v5_$mode 120 $K --gtest_filter="Kernels.MoeMxfp4ExpertGemmV5WarpSpecialized$mode"
  sanitize "Kernels.MoeMxfp4ExpertGemmV5WarpSpecialized$mode" racecheck
done
ts "bench-kernels, gate_up + down a layer"
for m_tk in 120b:4096 120b:8192; do
  m=${m_tk%%:*} tk=${m_tk##*:}
  bk_v5 "$m $tk mbar" $m $tk "mbar"
  GPTOSS_EXPERT_GEMM_V5_WS=1 bk_v5 "$m $tk ws-tma" $m $tk "ws-tma"
  GPTOSS_EXPERT_GEMM_V5_WS=2 bk_v5 "$m $tk ws-cpasync" $m $tk "ws-cpasync"
done
ts done
