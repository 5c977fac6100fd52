# Session 43, round 5: Nsight Compute of the lm_head screen's kernels at one token (bench-kernels 120b; the first screen launch is
# the default's, 2 chunks in flight): DRAM throughput against the fp8 copy's kernel, stalls.
source tools/gpu/rounds/prelude.sh
sec="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy"
for k in screen_kernel recompute_kernel select_kernel; do
  ts "ncu $k (bench-kernels 120b, 1 token)"
  timeout 140 ncu --clock-control none -k "regex:$k" --launch-count 1 $sec -o $out/ncu_$k \
    $g bench-kernels --model 120b --tokens 1 --iters 2 > $out/ncu_$k.txt 2>&1
  echo "ncu rc=$?" >> $S
  ncu -i $out/ncu_$k.ncu-rep --page details 2>&1 | grep -E "Duration|DRAM Throughput|Memory Throughput|Registers|Achieved Occupancy|Warp Cycles Per Issued|Stall|Grid Size|Block Size" | head -20 >> $S
  rm -f $out/ncu_$k.ncu-rep
done
ts done
