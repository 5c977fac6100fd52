# Session 20, round 4 (run as one device command; written out here): six row tiles a unit
# (GPTOSS_SKINNY_VARIANT=15) against the default at 32 and 64 tokens, two paired runs a model; then
# serving on the default (cp.async staging on, rt6 not yet the default).
source tools/gpu/rounds/prelude.sh
for m in 20b 120b; do
  for r in 1 2; do
    for v in 0 15; do
      ts step $m variant $v run $r
      GPTOSS_SKINNY_VARIANT=$v timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 32,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
    done
  done
done
ts serve 20b; serve_cs 20b -- 32 64
ts serve 120b; serve_cs 120b -- 32 64
ts done
rm -f $out/*.log
cat $S
