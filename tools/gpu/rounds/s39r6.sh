# Session 39, round 6 (split from s39r5 in the fortieth session; not yet run; after s39r3 has
# passed): Nsight Compute of version 5's warp-specialized kernel at 120b pp8192 (instructions a K
# step, stalls, against the thirty-seventh session's figures for the mbarrier kernel: ~240 warp
# instructions a warp a K step, issue slots 50% busy). WS_NCU picks the copy mode (1 tensor copies,
# the default; 2 cp.async, if s39r3 found the tensor copies wrong).
# Pack: as s39r3 (tools/gpu/pack.sh)
source tools/gpu/rounds/prelude.sh
ts "ncu, warp-specialized, 120b pp8192 (a 8192-token pass)"
sec="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section SourceCounters"
GPTOSS_EXPERT_GEMM_V5_WS=${WS_NCU:-1} timeout 200 ncu --clock-control none --import-source no -k "regex:expert_gemm_ws_kernel" \
  --launch-count 1 $sec -o $out/ws $g bench --device cuda --random-weights 120b --pp 8192 --tg '' --runs 1 > $out/ncu_ws.txt 2>&1
echo "ncu rc=$?" >> $S
ncu -i $out/ws.ncu-rep --page details 2>&1 | grep -vE "^\s*-+\s*$" |
  grep -E "expert_gemm_ws|Duration|Busy|Eligible|Executed Ipc|Registers|No Eligible|Warp Cycles|Issued Warp|Stall" | head -30 >> $S
ncu -i $out/ws.ncu-rep --page source --csv --print-source sass > $out/sass_ws.csv 2>&1
rm -f $out/ws.ncu-rep
ts done
