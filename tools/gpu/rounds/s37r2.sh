# Session 37, round 2: where version 5's prefill expert GEMM waits. Nsight Compute with source
# counters (stall samples by SASS instruction) of layer 0's gate_up in a 120b pp8192 pass (the
# 128-pair, four-warpgroup, mbarrier kernel the model runs there) and in a pp2048 pass (80 pairs,
# two warpgroups, block barrier); the SASS-level samples come back as CSV.
source tools/gpu/rounds/prelude.sh
sec="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats --section Occupancy"
for tk in 8192 2048; do
  ts "ncu pp$tk"
  timeout 200 ncu --clock-control none --import-source no -k "regex:expert_gemm_wa_kernel" --launch-count 1 $sec \
    -o $out/wa$tk $g bench --device cuda --random-weights 120b --pp $tk --tg '' --runs 1 > $out/ncu_run$tk.txt 2>&1
  echo "ncu rc=$?" >> $S
  ncu -i $out/wa$tk.ncu-rep --page details > $out/d.txt 2>&1
  grep -vE "^\s*-+\s*$" $out/d.txt | grep -E "expert_gemm_wa|Duration|Throughput|Busy|Eligible|Executed Ipc|Registers|No Eligible|Warp Cycles|Active Warps|Pipe|Stall|Issued Warp|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|DRAM" | head -60 >> $S
  ncu -i $out/wa$tk.ncu-rep --page source --csv --print-source sass > $out/sass$tk.csv 2>&1
  echo "sass rows $(wc -l < $out/sass$tk.csv)" >> $S
  rm -f $out/wa$tk.ncu-rep $out/d.txt
done
ts done
