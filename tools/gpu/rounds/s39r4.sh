# Session 39, round 4 (prepared in the thirty-ninth session, which had no machine; not yet run):
# the decode kernels' weight loads through L1 or past it. Every decode kernel reads its weights
# with __ldg (ld.global.nc, allocating in L1); bench-kernels' plain-read floors, which the 8-64-token
# warp walk trails by 1.14x at its own occupancy (s27r2), read the same bytes with
# ld.global.nc.L1::no_allocate. Never compared: two copies of gptoss built with
# GPTOSS_WEIGHTS_SKIP_L1 (skinny_chunk.cuh: kWeightLoad), one for the expert kernels
# (skinny_units.cu: the walk and the K-split unit kernel), one for the dense decode kernels and
# the block-per-tile ones (skinny_mma.cu). Same values, so whole steps count too.
# Pack: EXTRA_BINS="build/diag/gptoss_skipl1_units build/diag/gptoss_skipl1_dense" tools/gpu/pack.sh
#   (build them first: tools/gpu/diag_binary.sh skipl1_units src/backend/cuda/kernels/linear/skinny_units.cu
#    GPTOSS_WEIGHTS_SKIP_L1; the same with skipl1_dense and skinny_mma.cu)
source tools/gpu/rounds/prelude.sh
U=$bin/gptoss_skipl1_units D=$bin/gptoss_skipl1_dense
bk() {  # NAME BINARY TOKENS: the default expert rows and the walk-pattern floors
  timeout 120 $2 bench-kernels --model 120b --tokens $3 --iters 100 > $out/bk_$1_$3.txt 2>&1
  echo "== $1 $3 tokens" >> $S
  grep -E "experts (gate_up|down) \(mxfp4\) \| [^|]*x[0-9]+ \||warp-walk pattern, (weights|2 blocks)" $out/bk_$1_$3.txt >> $S
}
ts "bench-kernels 120b: HEAD, skip-L1 experts, alternating"
for tk in 1 8 64; do bk head $g $tk; bk skipl1 $U $tk; bk head $g $tk; bk skipl1 $U $tk; done
ts "steps: 120b bf16 tg128 at 1 and 64 sequences; 20b at 64"
for x in 1 64; do b head $g 120b 128 $x; b skipl1_units $U 120b 128 $x; done
b head $g 20b 128 64; b skipl1_units $U 20b 128 64
ts "dense decode kernels (skinny_mma.cu) past L1: 120b fp8 dense, one sequence"
b head $g 120b 128 1 --dense-dtype fp8; b skipl1_dense $D 120b 128 1 --dense-dtype fp8
b head $g 120b 128 1 --dense-dtype fp8; b skipl1_dense $D 120b 128 1 --dense-dtype fp8
ts done
