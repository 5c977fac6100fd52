# Session 25, round 1: main's final binaries (bc9450f) on the GPU: the model tests and version 5's
# tests, Nsight Compute of the prefill expert GEMM inside a 120b pp8192 pass (layer 0's gate_up and
# down at the automatic shape: four warpgroups, 96-pair tiles), then the model's prefill and step.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t model 200 $bin/test_cuda_model
t k 200 $K --gtest_filter='Kernels.ExpertGemmV5*:Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkward*:Kernels.MoeMxfp4Fragments:ExpertGemmV5Width.*:ExpertGemmV5Warpgroups.*:Kernels.MoeMxfp4ExpertGemmV3'
ts ncu
timeout 240 ncu --clock-control none -k "regex:expert_gemm_wa_kernel" --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters \
  -o $out/wa $g bench --device cuda --random-weights 120b --pp 8192 --tg '' --runs 1 > $out/ncu_run.txt 2>&1
echo "ncu rc=$?" >> $S; tail -3 $out/ncu_run.txt >> $S
ncu -i $out/wa.ncu-rep --page details > $out/wa_details.txt 2>&1
ncu -i $out/wa.ncu-rep --page raw --csv --metrics regex:smsp__pcsamp_warps_issue_stalled_.*,regex:smsp__average_warp_latency_issue_stalled_.*,smsp__inst_executed.sum,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active > $out/wa_raw.csv 2>&1
ncu -i $out/wa.ncu-rep --page source --csv --print-source sass --launch-count 1 > $out/wa_sass.csv 2>&1; xz -9 $out/wa_sass.csv
grep -E "expert_gemm_wa|Duration|Issue Slots Busy|Eligible Warps|Executed Instructions  |Registers Per|Throughput|Achieved Occupancy|No Eligible" $out/wa_details.txt | head -40 >> $S
rm -f $out/wa.ncu-rep
ts bench
for m in 120b 20b; do
  timeout 150 $g bench --device cuda --random-weights $m --pp 512,2048,8192 --tg 32 --batch 1,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S
done
ts done
cat $S
