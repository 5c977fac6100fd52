# Session 35, call 5: every 64-byte line of the skinny kernels' parameters read before their wait
# (warm_param_lines; __grid_constant__ SkinnyArgs) against the same tree without it
# (.gpu-carry/gptoss_cl4: qkv's norm-in clusters of 4 already in both): the one-token expert
# kernels' stage clocks (gate_up's routing issue was ~1,360 cycles), then tg128 pairs.
# Pack: EXTRA_BINS="/tmp/gptoss_cl4 build/diag/gptoss_units_clocks" PACK_TESTS="" tools/gpu/pack.sh
# (Dropped after this call: no change; warm_param_lines and the __grid_constant__ parameters are
# not in the tree. .gpu-carry/gptoss_cl4 was a copy of build/gptoss before the change.)
source tools/gpu/rounds/prelude.sh
for mf in "120b --dense-dtype fp8" "20b --dense-dtype fp8"; do
  m=${mf%% *}; f=${mf#$m}
  echo "== units clocks $m x1 $f" >> $S
  timeout 100 $bin/gptoss_units_clocks bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1 --runs 1 $f 2>&1 |
    grep -E "^\| random|clocks" | sed -E 's/mean cycles a block://' | awk '!seen[$0]++' >> $S
done
for mf in "120b --dense-dtype fp8" "120b" "120b --mxfp4-layers all" "20b --dense-dtype fp8"; do
  m=${mf%% *}; f=${mf#$m}
  for pass in 1 2; do
    b new $g $m 128 1 $f
    b cl4 $bin/gptoss_cl4 $m 128 1 $f
  done
done
for bt in 4 8 32; do
  b new $g 120b 32 $bt --dense-dtype fp8
  b cl4 $bin/gptoss_cl4 120b 32 $bt --dense-dtype fp8
done
ts done
