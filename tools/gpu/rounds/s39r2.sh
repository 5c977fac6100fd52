# Session 39, round 2 (prepared in the thirty-ninth session, which had no machine; not yet run): why
# the 8-64-token warp walk runs at 1.14x the plain read of its own bytes at its own occupancy
# (s27r2: 120b gate_up at 64 tokens 260.8 against 229.3 us). The walk is ~84% of a 64-sequence
# step (s38r5), so that gap is the largest share of issue 14's 120b targets left (~2 ms of 16.4).
# Nsight Compute of the walk (gate_up and down) and of the plain read in the walk's pattern
# (stream_experts_walk_kernel: modes 5-8, mode 7 at the walk's 16 warps an SM, 100 KB of shared
# memory reserved) in one bench-kernels run at 64 tokens, with stall samples by SASS instruction
# for each; the SASS-level CSVs come back for reading between sessions.
# Pack: tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
sec="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats --section Occupancy"
metrics() {
  ncu -i $1 --page details > $out/d.txt 2>&1
  grep -vE "^\s*-+\s*$" $out/d.txt | grep -E "skinny_warp_units|stream_experts_walk|Duration|Throughput|Busy|Eligible|Executed Ipc|Registers|Dynamic Shared|No Eligible|Warp Cycles|Active Warps|Stall|Issued Warp|L2 Hit|Mem Busy|Max Bandwidth|DRAM" | head -${2:-80} >> $S
  rm -f $out/d.txt
}
# (bench-kernels times each row after a warm-up of 10: with --iters 2, 12 launches a row. The walk's
# first launch is the default rows' gate_up, the 13th most likely their down (the names and grids in
# the summary say which); the plain read's modes 5-8 run in order, so mode 5 is launch 0, mode 7 launch 24.)
for job in skinny_warp_units_kernel:0:walk_a skinny_warp_units_kernel:12:walk_b stream_experts_walk_kernel:0:floor_mode5 \
           stream_experts_walk_kernel:24:floor_mode7; do
  IFS=: read -r k skip tag <<< "$job"
  ts "ncu $tag: $k, launch $skip (bench-kernels 120b, 64 tokens)"
  timeout 140 ncu --clock-control none --import-source no -k "regex:$k" --launch-skip $skip --launch-count 1 $sec \
    -o $out/$tag $g bench-kernels --model 120b --tokens 64 --iters 2 > $out/ncu_$tag.txt 2>&1
  echo "ncu rc=$?" >> $S
  metrics $out/$tag.ncu-rep 60
  ncu -i $out/$tag.ncu-rep --page source --csv --print-source sass > $out/sass_$tag.csv 2>&1
  echo "sass rows $(wc -l < $out/sass_$tag.csv)" >> $S
  rm -f $out/$tag.ncu-rep
done
ts done
