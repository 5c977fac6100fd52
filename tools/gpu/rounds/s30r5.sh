# (Ran the binaries of branch s30-carveout: GPTOSS_SMEM_CARVEOUT exists there only.)
# Session 30, call 5 (branch s30-carveout: main + GPTOSS_SMEM_CARVEOUT; gptoss_3a9 = 3a90ae1).
# f248132 slowed the one-token step 7% with the router fold on (s30r4) and nothing else changed
# there but static shared memory: the K-split fold kernel's 4544 -> 4944 bytes puts three blocks
# (39.5 KB dynamic each, 1 KB reserved) past the 132 KB configuration, o_proj's fold kernel's
# 1040 -> 2064. The guess: a kernel whose shared-memory configuration differs from its
# predecessor's cannot share an SM with it, so its programmatic early launch waits. Test: every PDL
# kernel asks for the same carveout (100: all shared), against the driver's choice and 3a9.
# Pack: EXTRA_BINS="/tmp/gptoss_3a9" PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
RUNS=3
old=$bin/gptoss_3a9
ts start
for rep in 1 2; do
  b main $g 120b 64 1 --dense-dtype fp8
  GPTOSS_SMEM_CARVEOUT=100 b co100 $g 120b 64 1 --dense-dtype fp8
  b 3a9 $old 120b 64 1 --dense-dtype fp8
  GPTOSS_SMEM_CARVEOUT=100 b co100 $g 120b 64 1
  b 3a9 $old 120b 64 1
  b main $g 20b 64 1 --dense-dtype fp8
  GPTOSS_SMEM_CARVEOUT=100 b co100 $g 20b 64 1 --dense-dtype fp8
  b 3a9 $old 20b 64 1 --dense-dtype fp8
done
ts batches
for rep in 1 2; do
  b main $g 120b 32 4,8,32,64 --dense-dtype fp8
  GPTOSS_SMEM_CARVEOUT=100 b co100 $g 120b 32 4,8,32,64 --dense-dtype fp8
  b main $g 20b 32 8,64
  GPTOSS_SMEM_CARVEOUT=100 b co100 $g 20b 32 8,64
done
GPTOSS_SMEM_CARVEOUT=100 b co100 $g 120b 64 1 --mxfp4-layers all
b 3a9 $old 120b 64 1 --mxfp4-layers all
ts prefill
echo "== main 120b pp2048" >> $S
timeout 100 $g bench --device cuda --random-weights 120b --pp 2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" >> $S
echo "== co100 120b pp2048" >> $S
GPTOSS_SMEM_CARVEOUT=100 timeout 100 $g bench --device cuda --random-weights 120b --pp 2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" >> $S
ts done
cat $S
