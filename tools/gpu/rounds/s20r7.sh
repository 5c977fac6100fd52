# Session 20, round 7: what the unit-walking kernel's access pattern costs by itself. bench-kernels'
# plain-read rows now include the same bytes read in the units kernel's pattern (four row tiles
# a block, 512 bytes a warp, no math, no dependent chain), weights alone and with each chunk's
# 32-byte scale sector, beside the contiguous floor and the kernel itself.
source tools/gpu/rounds/prelude.sh
for mt in "20b 64" "120b 64" "120b 8"; do
  set -- $mt; ts bench-kernels $1 $2
  timeout 60 $g bench-kernels --model $1 --tokens $2 --iters 50 2>&1 | grep -E "experts (gate_up|down)" | grep -E "plain read|skinny_mma \(fragments\)" >> $S
done
ts done
cat $S
