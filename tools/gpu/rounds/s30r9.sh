# Session 30, call 9: which kernel's 8-token sizes cost the one-token step. gptoss: main (4);
# gptoss_po4: 8 but o_proj's fold pieces (its shared rows, the unrolled sums, the staging margin)
# at 4; gptoss_pu4: 8 but the expert kernels' fold arrays at 4. tg64 x1, alternating.
# Pack: EXTRA_BINS="/tmp/gptoss_po4 /tmp/gptoss_pu4" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for rep in 1 2; do
  b main $g 120b 64 1 --dense-dtype fp8; b po4 $bin/gptoss_po4 120b 64 1 --dense-dtype fp8; b pu4 $bin/gptoss_pu4 120b 64 1 --dense-dtype fp8
  b main $g 120b 64 1; b po4 $bin/gptoss_po4 120b 64 1; b pu4 $bin/gptoss_pu4 120b 64 1
done
ts done
cat $S
