# Session 23, round 4: what programmatic dependent launch buys, and whether bench-kernels'
# back-to-back timings of the skinny kernels (which stage weights before griddepcontrol.wait)
# include an overlap with their own previous launch: GPTOSS_PDL=0 launches every kernel without
# programmatic stream serialization. bench-kernels (dense layers, experts) and the step, PDL on / off.
# Pack: PACK_TESTS=" " bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
for T in 1 32; do
  for p in 1 0; do
    ts bench-kernels 120b $T pdl $p
    GPTOSS_PDL=$p timeout 100 $g bench-kernels --model 120b --tokens $T --iters 100 2>&1 | grep -E "^\| (qkv|o_proj|experts gate_up \+ down|experts gate_up \(mxfp4\) .*default|experts down \(mxfp4\) .*default|moe combine.*default|router)" >> $S
  done
done
for m in 120b 20b; do
  for p in 1 0; do
    ts step $m pdl $p
    GPTOSS_PDL=$p timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 1,8,32 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
ts done
cat $S
