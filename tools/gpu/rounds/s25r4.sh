# Session 25, round 4: the final rule (the mbarrier hand-off at 128-pair tiles with four
# warpgroups only; the cheaper 128-pair cost only there): the version 5 and model tests, the
# prefill where s25r3 saw 20b pp1024 lose, and 120b serving at 64 streams with
# GPTOSS_EXPERT_GEMM_V5_MBAR=0 and 1 on the same machine.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t k 200 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:ExpertGemmV5Width.*:ExpertGemmV5Warpgroups.*'
t model 200 $bin/test_cuda_model
ts prefill
for mb in 0 1; do
  echo "== 20b MBAR=$mb" >> $S
  GPTOSS_EXPERT_GEMM_V5_MBAR=$mb timeout 100 $g bench --device cuda --random-weights 20b --pp 512,1024,2048,4096 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
done
echo "== 120b default" >> $S
timeout 100 $g bench --device cuda --random-weights 120b --pp 2048,4096,8192 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
ts serve
GPTOSS_EXPERT_GEMM_V5_MBAR=0 srv 18100 120b -- 64
GPTOSS_EXPERT_GEMM_V5_MBAR=1 srv 18101 120b -- 64
ts done
cat $S
