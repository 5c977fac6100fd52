# Session 15, round 2: round 1's decode-cost experiment at 8-64 tokens (its files did not come back).
source tools/gpu/rounds/prelude.sh
mkdir -p $bin/exp && tar -C $bin/exp -xJf .gpu-carry-pack/exp.tar.xz
for v in base exp1 exp2; do
  gb=$g; [ $v != base ] && gb=$bin/exp/gptoss_$v
  for mt in "20b 32" "20b 64" "120b 8" "120b 32" "120b 64"; do
    set -- $mt
    timeout 100 $gb bench-kernels --model $1 --tokens $2 --iters 50 > $out/bk.txt 2>&1
    grep -E "fragments|plain read" $out/bk.txt | sed "s/^/$v $1 $2 /" >> $S
  done
done
ts ncu
timeout 150 ncu -k regex:skinny_units --launch-skip 20 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy --section SchedulerStats $g bench-kernels --model 20b --tokens 32 --iters 5 > $out/ncu.txt 2>&1
echo "ncu rc=$?" >> $S
grep -v "^==PROF==" $out/ncu.txt | grep -A200 "skinny_units" | head -120 >> $S
rm -f $out/bk.txt $out/ncu.txt
ts done
