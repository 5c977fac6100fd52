# Session 26, round 6 (prepared, not run: no device time left): does the warp walk's access pattern
# cost DRAM efficiency? bench-kernels' plain-read rows now include the walk's pattern (mode 5: a
# warp streams a whole row tile, a block's 8 warps 8 streams 23 KB apart) and the same reads at
# the addresses of a layout interleaving 8 tiles chunk by chunk (mode 6: a block's warps read 4 KB
# of adjacent memory at a time). If mode 6 reads clearly faster than mode 5 (s26r4: the walk itself
# runs at 75% of DRAM peak, the units pattern's plain read at ~92%), a packed layout made for the
# walk is the lever for the 8-64-token experts.
# Pack: PACK_TESTS=" " bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
for mt in 120b:8 120b:32 120b:64 20b:64; do
  m=${mt%:*}; tok=${mt#*:}
  timeout 60 $g bench-kernels --model $m --tokens $tok --iters 100 > $out/bk_${m}_$tok.md 2>&1
  echo "== $m tokens $tok" >> $S
  grep -E "plain read|warp units rt1 pf8 16w \|" $out/bk_${m}_$tok.md >> $S
done
ts done
cat $S
