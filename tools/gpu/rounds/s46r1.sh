# Session 46, round 1: where the decode attention's time goes at 32 and 64 sequences (120b, bf16
# dense layers, context 512-528). The traced step (s38r5) gave a sliding layer 15.7-18.2 us and a
# full one 24.8 + 3.3 (merge) at 64 sequences against bytes floors of ~4 and ~16 us (16.8 / 67 MB
# of K/V at 4.3 TB/s). Here: bench-kernels' attention rows, the traced step, each block's stage
# clocks (diagnostic binary gptoss_attn_clocks) and Nsight Compute of one full and one sliding
# launch at 64 sequences.
# Pack: EXTRA_BINS="build/tests/engine/bench_engine_host build/libgptoss_kernel_trace.so
#   build/diag/gptoss_attn_clocks" (tools/gpu/diag_binary.sh attn_clocks
#   src/backend/cuda/kernels/attention/attention_decode_mma.cu GPTOSS_DIAG_ATTN_CLOCKS)
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for tk in 32 64; do
  ts "bench-kernels attention $tk"
  timeout 90 $g bench-kernels --model 120b --tokens $tk --attention-only --iters 50 > $out/ba$tk.txt 2>&1
  grep -E "decode" $out/ba$tk.txt | head -12 >> $S
done
export TRACE_GREP="replay to replay|sum of adds|attention"
for x in 32 64; do left 300 && trace_bench step $x --random-weights 120b; done
for x in 64 32; do
  left 380 && { ts "attention clocks x$x"
  timeout 100 $bin/gptoss_attn_clocks bench --device cuda --random-weights 120b --pp '' --tg 16 --batch $x --runs 1 \
    > $out/clk$x.txt 2>&1; grep -E "^\| random|attention" $out/clk$x.txt | head -12 >> $S; }
done
left 440 && { ts "ncu x64"
  timeout 140 ncu --clock-control none --kernel-name-base demangled -k "regex:attention_decode_mma_kernel" \
    --launch-skip 108 --launch-count 2 --set full -o $out/at $g bench --device cuda --random-weights 120b --pp '' \
    --tg 4 --batch 64 --runs 1 > $out/at_run.txt 2>&1; echo "ncu rc=$?" >> $S
  ncu -i $out/at.ncu-rep --page details > $out/at_d.txt 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Theoretical Occ|Waves Per SM|attention_decode_mma_kernel" $out/at_d.txt | head -30 >> $S
  rm -f $out/at.ncu-rep; xz -6 $out/at_d.txt; }
ts done
