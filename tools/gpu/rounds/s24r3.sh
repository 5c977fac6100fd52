# Session 24, round 3: the final binaries (four warpgroups a version 5 CTA from 64-pair tiles and
# 8192 pairs up): the kernel and model tests, the model's prefill and step, serving at 32 and 64.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t model 200 $bin/test_cuda_model
t k 200 $K --gtest_filter='Kernels.ExpertGemmV5*:Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkward*:Kernels.MoeMxfp4Fragments:ExpertGemmV5Width.*:ExpertGemmV5Warpgroups.*:Kernels.MoeMxfp4ExpertGemmV3'
ts bench
for m in 120b 20b; do
  timeout 120 $g bench --device cuda --random-weights $m --pp 512,1024,2048,8192 --tg 32 --batch 1,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
ts serve
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
ts done
cat $S
