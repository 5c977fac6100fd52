source tools/gpu/rounds/prelude.sh
ts ncu-v5
timeout 240 ncu --clock-control none --kernel-name-base demangled -k "regex:expert_gemm_wa_kernel" --launch-skip 0 --launch-count 1 --set full --import-source yes -o $out/wa $g bench-kernels --model 120b --tokens 2048 --iters 2 > $out/ncu_run.txt 2>&1; echo "ncu rc=$?" >> $S; tail -2 $out/ncu_run.txt >> $S
ncu -i $out/wa.ncu-rep --page details > $out/wa_details.txt 2>&1
grep -E "Duration|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|No Eligible|Active Warps Per|Executed Instructions  |Tensor|Compute \(SM\) Thr|Memory Thr|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Theoretical Occ|Block Limit|Shared Memory Config" $out/wa_details.txt | head -50 >> $S
ncu -i $out/wa.ncu-rep --page raw --csv > $out/wa_raw.csv 2>&1
python3 - "$out/wa_raw.csv" >> $S 2>&1 <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h, v = rows[0], rows[2] if len(rows) > 2 else rows[1]
st = [(h[i], v[i]) for i in range(len(h)) if 'smsp__average_warp_latency_issue_stalled' in h[i] or 'smsp__pcsamp_warps_issue_stalled' in h[i]]
def num(x):
    try: return float(x.replace(',', ''))
    except: return 0.0
st = sorted(st, key=lambda t: -num(t[1]))[:24]
for k, val in st: print(k, val)
for k in h:
    if 'pipe_tensor' in k or 'inst_executed_pipe' in k and 'pct' in k: pass
for i in range(len(h)):
    if ('pipe_tensor_op' in h[i] or 'pipe_alu' in h[i] or 'pipe_fma' in h[i] or 'pipe_lsu' in h[i]) and 'pct_of_peak' in h[i]: print(h[i], v[i])
PY
ncu -i $out/wa.ncu-rep --page source --print-source sass --csv > $out/wa_sass.csv 2>&1; wc -l $out/wa_sass.csv >> $S; xz -6 $out/wa_sass.csv
ts done
cat $S
