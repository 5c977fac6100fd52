# Session 37, round 1: version 5 of the prefill expert GEMM with three warpgroups a CTA (192 weight
# rows, 384 threads, one CTA an SM, 168 registers a thread: two A buffers at every width, 128
# pairs too; GPTOSS_EXPERT_GEMM_V5_WG=3) against four and two: bench-kernels gate_up + down at
# 2048 and 8192 tokens, the model's prefill (auto against three, alternating), the version 5 tests
# at every width and all three CTA shapes.
# Pack: PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts bench-kernels
for m in 120b 20b; do for tk in 2048 8192; do for w in 3 4 2; do
  [ $tk = 8192 ] && [ $w = 2 ] && continue
  for mb in 1 2; do
    [ $mb = 2 ] && [ $w != 3 ] && continue
    GPTOSS_EXPERT_GEMM_V5_WG=$w GPTOSS_EXPERT_GEMM_V5_MBAR=$mb bk_v5 "$m $tk WG=$w MBAR=$mb" $m $tk
  done
done; done; done
ts prefill
pp_ab GPTOSS_EXPERT_GEMM_V5_WG "0 3" 512,1024,2048,4096,8192 120b 20b
ts tests
t k 240 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkward*:Kernels.MoeMxfp4Fragments'
ts done
cat $S
