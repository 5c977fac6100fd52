# Session 26, round 3: ceilings for the expert decode kernels' arithmetic, timing only (garbage
# outputs; bench-kernels' routing is fixed, so the bytes are the same). gptoss_NO_MATH: the
# scale load kept, no scale math (s_lo = s_hi = 1). gptoss_CHEAP_DECODE: the e2m1 decode in 5
# integer ops a code word instead of 11 (what an e2m1 -> e4m3 decode for the fp8 MMA would
# cost). Against main's binary (gptoss, 691e827) on the same machine.
# Build: tools/gpu/diag_binary.sh CHEAP_DECODE src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_CHEAP_DECODE
# Build: tools/gpu/diag_binary.sh NO_MATH src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_SCALE_NO_MATH
# Pack: PACK_TESTS=" " EXTRA_BINS="build/diag/gptoss_CHEAP_DECODE build/diag/gptoss_NO_MATH" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts bench-kernels
for mt in 120b:1 120b:8 120b:32 120b:64 20b:64; do
  m=${mt%:*}; tok=${mt#*:}
  for b in gptoss gptoss_CHEAP_DECODE gptoss_NO_MATH; do
    timeout 60 $bin/$b bench-kernels --model $m --tokens $tok --iters 100 > $out/bk_${m}_${tok}_$b.md 2>&1
    echo "== $m tokens $tok $b" >> $S
    grep -E "units ks8 rt4 pf1|units ks8 rt2 pf2|warp units rt1 pf8 16w|warp units rt1 pf6 16w 16-token|weights \+ scales \|" $out/bk_${m}_${tok}_$b.md | head -12 >> $S
  done
done
ts done
cat $S
