# Session 16, round 5 (branch s16-oproj-one-tile-staged): o_proj at 1-2 tokens as one tile a block of
# 8 warps with 2/4/6 staged chunk groups (GPTOSS_DENSE_STAGE_O1) against the default two-tile
# 16-warp shape with 3.
source tools/gpu/rounds/prelude.sh
b() { local tag=$1; shift; timeout 60 $g bench --device cuda --random-weights "$@" --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/$tag /" >> $S; }
for m in 120b 20b; do for o in 0 2 4 6 0 4 6; do GPTOSS_DENSE_STAGE_O1=$o b "$m o1=$o" $m --batch 1,2; done; done
ts done
cat $S
