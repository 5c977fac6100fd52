# Session 25, round 2: version 5 with the activation tile handed between warpgroups by mbarriers
# (GPTOSS_EXPERT_GEMM_V5_MBAR=1: no block barrier a K step) against the block barrier (=0): the
# tests at every width and both CTA shapes (twice: a race would show as a wrong result), the model
# tests, bench-kernels at 2048 and 8192 tokens, the model's prefill, and Nsight Compute of the
# mbarrier kernel in a 120b pp8192 pass (layer 0's gate_up and down).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
for i in 1 2; do
  t k$i 300 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkward*:Kernels.MoeMxfp4Fragments'
done
t model 200 $bin/test_cuda_model
ts bench-kernels
for m in 120b 20b; do for tk in 2048 8192; do for mb in 0 1; do
  echo "== $m $tk MBAR=$mb" >> $S
  GPTOSS_EXPERT_GEMM_V5_MBAR=$mb timeout 90 $g bench-kernels --model $m --tokens $tk --iters 5 > $out/bk.txt 2>&1
  grep -E "gate_up \+ down.*v5.*kperm" $out/bk.txt | sed -E 's/^\| experts gate_up \+ down \| [^|]*\| //' >> $S
done; done; done
ts prefill
for m in 120b 20b; do for mb in 0 1 0 1; do
  echo "== $m MBAR=$mb" >> $S
  GPTOSS_EXPERT_GEMM_V5_MBAR=$mb timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048,8192 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
done; done
ts ncu
timeout 200 ncu --clock-control none -k "regex:expert_gemm_wa_kernel" --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  -o $out/wa $g bench --device cuda --random-weights 120b --pp 8192 --tg '' --runs 1 > $out/ncu_run.txt 2>&1
echo "ncu rc=$?" >> $S
ncu -i $out/wa.ncu-rep --page details > $out/wa_details.txt 2>&1
ncu -i $out/wa.ncu-rep --page raw --csv --metrics regex:smsp__pcsamp_warps_issue_stalled_.*,smsp__inst_executed.sum > $out/wa_raw.csv 2>&1
grep -E "expert_gemm_wa|Duration|Issue Slots Busy|Eligible Warps|Executed Instructions  |Registers Per|No Eligible|Warp Cycles Per Issued" $out/wa_details.txt | head -30 >> $S
rm -f $out/wa.ncu-rep
ts done
cat $S
