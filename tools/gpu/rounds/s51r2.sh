# Session 51, round 2 (an H200; ~9.5 minutes): do the expert walk's loads lose DRAM efficiency to
# the size of what L2 fetches a request, or to L2's keeping them? Diagnostic copies of gptoss
# (tools/gpu/diag_binary.sh; the same values, only cache hints, so whole steps mean something too)
# whose skinny_units.cu loads carry `.L2::256B`: pf256 codes and scales, cd256 codes only, sc256
# scales only (a chunk's 32 scale bytes; L2 then holds the next seven chunks' scales); fl256 the
# plain-read floors so; ef the codes with an L2 evict-first policy.
# (1) bench-kernels' walk rows at 64 and 32 tokens, each binary. (2) If a variant's gate_up + down +
# combine at 64 tokens beats main's by 2% or more: the 32- and 64-sequence steps, main / it, twice,
# then 120b serving at 32 and 64 streams with each; else the steps of all five, alternating, twice.
# (3) one sequence, main / pf256, if time is left.
# Pack: EXTRA_BINS="build/diag/gptoss_pf256 build/diag/gptoss_cd256 build/diag/gptoss_sc256 build/diag/gptoss_fl256
# build/diag/gptoss_ef"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for tk in 64 32; do
  for v in main pf256 cd256 sc256 ef; do
    left 250 && bk_walk $v $(binof $v) $tk 0
  done
done
left 270 && bk_walk fl256 $bin/gptoss_fl256 64 0
ts "bench-kernels done"
best=main; bestus=$(moe64 main)
for v in pf256 cd256 sc256 ef; do
  us=$(moe64 $v)
  [ -n "$us" ] && [ -n "$bestus" ] && awk -v a=$us -v b=$bestus 'BEGIN{exit !(a < b)}' && { best=$v; bestus=$us; }
done
mainus=$(moe64 main)
echo "best at 64 tokens: $best ($bestus us; main $mainus)" >> $S
if [ $best != main ] && awk -v a=$bestus -v b=$mainus 'BEGIN{exit !(a < 0.98 * b)}'; then
  for i in 1 2; do for v in main $best; do
    left 330 && RUNS=1 b "$v" $(binof $v) 120b 128 32,64
  done; done
  ts "steps done"
  serve_each 470 main $best
else
  for i in 1 2; do for v in main pf256 cd256 sc256 ef; do
    left 480 && RUNS=1 b "$v" $(binof $v) 120b 128 32,64
  done; done
  ts "steps x32/x64 done"
fi
for i in 1 2; do for v in main pf256; do
  left 560 && RUNS=1 b "$v" $(binof $v) 120b 128 1
done; done
ts done
