# Session 27, round 1: does the warp walk lose DRAM efficiency to its access pattern? bench-kernels'
# plain-read rows (mode 5: the walk's pattern, a block's 8 warps 8 streams 23 KB apart; mode 6: the
# same reads at interleaved addresses) and the default kernels on copies whose row tiles are
# interleaved chunk by chunk (branch s27-interleave: gate_up in groups of 8, down of 4), beside the
# plain copies; the interleaved walk's bit-equality test; the one-token step with fp8 dense layers
# and with --mxfp4-layers all (issue 10's second and third targets).
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t walk 150 $K --gtest_filter='Kernels.SkinnyWarpWalkInterleaved*:Kernels.SkinnyUnits*'
for mt in 120b:8 120b:32 120b:64 20b:64; do
  m=${mt%:*}; tok=${mt#*:}
  timeout 90 $g bench-kernels --model $m --tokens $tok --iters 100 > $out/bk_${m}_$tok.md 2>&1
  echo "== $m tokens $tok" >> $S
  grep -E "plain read|warp units rt1 pf8 16w \||\(fragments\)|interleaved" $out/bk_${m}_$tok.md | grep -v "GEMM" >> $S
done
ts step
for m in 120b 20b; do
  for f in "--dense-dtype fp8" "--mxfp4-layers all"; do
    echo "== $m $f" >> $S
    timeout 80 $g bench --device cuda --random-weights $m $f --pp '' --tg 128 --batch 1 --runs 1 2>&1 | grep -E "^\| random" >> $S
  done
done
ts done
cat $S
