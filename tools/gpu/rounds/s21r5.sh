# Session 21, fifth round (run inline on s21r4's warm machine, same binaries): a second pair of
# steps, the warp walk off / on.
source tools/gpu/rounds/prelude.sh
for m in 20b 120b; do for w in 0 2; do
  ts step $m warp_units $w
  GPTOSS_WARP_UNITS=$w timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,4,8,32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
done; done
cat $S
