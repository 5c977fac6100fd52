# Session 24, round 2: version 5's CTA shape chosen by width (four warpgroups from 64-pair tiles up,
# two below; GPTOSS_EXPERT_GEMM_V5_WG=0, the new default): the kernel tests at both shapes, the
# model's prefill against two warpgroups forced, and serving at 32 and 64 streams.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t model 200 $bin/test_cuda_model
t k 200 $K --gtest_filter='Kernels.ExpertGemmV5*:Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkward*:Kernels.MoeMxfp4Fragments:ExpertGemmV5Width.*'
grep -E "wgs|warpgroups|worst rel err" $out/k.log | tail -4 >> $S
ts prefill
for m in 120b 20b; do for w in 0 2 0 2; do
  echo "== $m WG=$w" >> $S
  GPTOSS_EXPERT_GEMM_V5_WG=$w timeout 100 $g bench --device cuda --random-weights $m --pp 512,1024,2048,8192 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
done; done
ts serve
srv 18100 120b -- 32 64
srv 18101 20b -- 32 64
ts serve-wg2
GPTOSS_EXPERT_GEMM_V5_WG=2 srv 18102 120b -- 32
ts done
cat $S
