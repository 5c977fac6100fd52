# Session 24, round 1: main's final kernels checked (the model tests, the step at 1 and 32 tokens),
# and the prefill expert GEMM (version 5) with four warpgroups a CTA (256 weight rows sharing one
# activation tile, one CTA an SM; GPTOSS_EXPERT_GEMM_V5_WG=4) against two (the default): its tests,
# bench-kernels at 2048 and 8192 tokens, the model's prefill, and Nsight Compute of both at 120b,
# 8192 tokens (96-pair tiles, gate_up and down with the activations k-permuted).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t model 200 $bin/test_cuda_model
for w in 2 4; do
  GPTOSS_EXPERT_GEMM_V5_WG=$w t k$w 150 $K --gtest_filter='Kernels.ExpertGemmV5*:Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkward*:Kernels.MoeMxfp4Fragments'
done
ts v5-widths
for m in 120b 20b; do for tk in 2048 8192; do for w in 2 4; do
  echo "== $m $tk WG=$w" >> $S
  GPTOSS_EXPERT_GEMM_V5_WG=$w timeout 90 $g bench-kernels --model $m --tokens $tk --iters 5 > $out/bk_${m}_${tk}_$w.txt 2>&1
  grep -E "gate_up \+ down.*v5.*kperm" $out/bk_${m}_${tk}_$w.txt >> $S
done; done; done
ts ncu
for w in 2 4; do
  GPTOSS_EXPERT_GEMM_V5_WG=$w timeout 150 ncu --clock-control none --kernel-name-base demangled -k "regex:expert_gemm_wa_kernel<96" --launch-skip 32 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats \
    -o $out/wa$w $g bench-kernels --model 120b --tokens 8192 --iters 1 > $out/ncu_run$w.txt 2>&1; echo "ncu WG=$w rc=$?" >> $S
  ncu -i $out/wa$w.ncu-rep --page details > $out/wa_details$w.txt 2>&1
  grep -E "expert_gemm_wa|Duration|Issue Slots Busy|Eligible Warps|Executed Instructions  |Registers Per|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Achieved Occupancy|No Eligible|Stall" $out/wa_details$w.txt | head -50 >> $S
  rm -f $out/wa$w.ncu-rep
done
ts prefill
for m in 120b 20b; do for w in 2 4; do
  echo "== $m WG=$w" >> $S
  GPTOSS_EXPERT_GEMM_V5_WG=$w timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048,8192 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
done; done
ts step
timeout 60 $g bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 1,32 --runs 1 2>&1 | grep -E "^\| random" >> $S
ts done
cat $S
