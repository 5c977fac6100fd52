# Session 15, round 1: how much of the decode MoE kernels' time is the e2m1 decode? The same
# binaries with the decode replaced (exp1: no decode ops; exp2: 7 ops a word as an e4m3 decode
# would take; both give wrong numbers, timing only). The experiment binaries were built here with
# `#define GPTOSS_DECODE_EXP 1` (or 2) prepended to kernels/linear/frag_layout.cuh, whose
# mx_word_to_f16x2 then returned { q, q ^ 0x1000, q ^ 0x2000, q ^ 0x4000 } (1) or
# { q & m, (q << 1) & m, (q << 2) & m, (q >> 3) & m } with m = 0x8E008E00 (2), packed as exp.tar.xz.
source tools/gpu/rounds/prelude.sh
mkdir -p $bin/exp && tar -C $bin/exp -xJf .gpu-carry-pack/exp.tar.xz
ts kernels
for v in base exp1 exp2; do
  gb=$g; [ $v != base ] && gb=$bin/exp/gptoss_$v
  for mt in "120b 1" "120b 8" "120b 32" "120b 64" "20b 32" "20b 64" "20b 1"; do
    set -- $mt
    timeout 100 $gb bench-kernels --model $1 --tokens $2 --iters 50 > $out/bk_${v}_$1_$2.txt 2>&1
    grep -E "^\| experts (gate_up|down) \(mxfp4\) \| [0-9]+x?[0-9]*, |plain read" $out/bk_${v}_$1_$2.txt | sed "s/^/$v $1 $2 /" >> $S
  done
done
ts tg
for v in base exp2; do
  gb=$g; [ $v != base ] && gb=$bin/exp/gptoss_$v
  for m in 20b 120b; do
    timeout 150 $gb bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/$v /" >> $S
  done
done
ts ncu
timeout 150 ncu -k regex:skinny_units --launch-skip 20 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy --section SchedulerStats $g bench-kernels --model 20b --tokens 32 --iters 5 > $out/ncu_units_20b_32.txt 2>&1
echo "ncu rc=$?" >> $S
ts done
cat $S
