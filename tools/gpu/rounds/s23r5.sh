# Session 23, rounds 5-7 (rounds 6-7: 120b only, with the aligned inline mode 3 and the 128-byte scale requests, mode 4): would the scales packed beside their codes (each 512-byte chunk followed by
# its 32 scale bytes) read faster than the separate scale array? bench-kernels' plain-read rows
# (the unit-walking pattern, no math): codes only, codes + the scale array, codes + scales inline.
# Pack: PACK_TESTS=" " bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
for m in 120b; do
  for T in 1 8 32 64; do
    ts bench-kernels $m $T
    timeout 100 $g bench-kernels --model $m --tokens $T --iters 100 2>&1 | grep -E "plain read|experts gate_up \(mxfp4\) .*(fragments|default)|experts down \(mxfp4\) .*(fragments|default)" >> $S
  done
done
ts done
cat $S
