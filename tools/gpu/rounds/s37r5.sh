# Session 37, round 5: version 5's persistent CTAs where a CTA fills its SM (four warpgroups, 64
# pairs and up; GPTOSS_EXPERT_GEMM_V5_PERSIST=1) against a CTA an item (=0): bench-kernels' v5 rows,
# the model's prefill alternating, the version 5 tests (persistent by default), the model tests.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts bench-kernels
for mt in 120b:4096 120b:2048 20b:2048; do for p in 1 0; do
  GPTOSS_EXPERT_GEMM_V5_PERSIST=$p bk_v5 "${mt/:/ } PERSIST=$p" ${mt%:*} ${mt#*:} wg4
done; done
ts prefill
pp_ab GPTOSS_EXPERT_GEMM_V5_PERSIST "1 0" 2048,4096,8192 120b 20b
ts tests
t model 200 $bin/test_cuda_model
t k 230 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:ExpertGemmV5Width.*'
ts done
