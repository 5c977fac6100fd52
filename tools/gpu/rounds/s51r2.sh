# Session 51, round 2 (an H200; ~8 minutes): do the expert walk's loads lose DRAM efficiency to the
# size of what L2 fetches a request? Diagnostic copies of gptoss (tools/gpu/diag_binary.sh; the
# same values, only cache hints, so whole steps mean something too) whose skinny_units.cu loads
# carry `.L2::256B`: pf256 codes and scales, cd256 codes only, sc256 scales only (a chunk's 32
# scale bytes; L2 then holds the next seven chunks' scales); fl256 the plain-read floors so; ef
# the codes with an L2 evict-first policy (`createpolicy.fractional.L2::evict_first`).
# (1) bench-kernels' walk rows at 64 and 32 tokens, each binary; (2) the 32- and 64-sequence steps,
# main / pf256 / cd256 / sc256 / ef alternating, twice; (3) one sequence, main / pf256, twice.
# Pack: EXTRA_BINS="build/diag/gptoss_pf256 build/diag/gptoss_cd256 build/diag/gptoss_sc256 build/diag/gptoss_fl256
# build/diag/gptoss_ef"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for tk in 64 32; do
  for v in main pf256 cd256 sc256 ef; do
    if [ $v = main ]; then bb=$g; else bb=$bin/gptoss_$v; fi
    left 250 && bk_walk $v $bb $tk 0
  done
done
left 270 && bk_walk fl256 $bin/gptoss_fl256 64 0
ts "bench-kernels done"
for i in 1 2; do
  for v in main pf256 cd256 sc256 ef; do
    if [ $v = main ]; then bb=$g; else bb=$bin/gptoss_$v; fi
    left 480 && RUNS=1 b "$v" $bb 120b 128 32,64
  done
done
ts "steps x32/x64 done"
for i in 1 2; do
  for v in main pf256; do
    if [ $v = main ]; then bb=$g; else bb=$bin/gptoss_$v; fi
    left 560 && RUNS=1 b "$v" $bb 120b 128 1
  done
done
ts done
