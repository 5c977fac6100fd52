# Session 23, round 9 (prepared, not run: the device time was spent): main's final binaries (the GPTOSS_PDL knob at its default, bench-kernels'
# plain-read modes): the model tests, the plain-read rows at one token, the batch-1 and 32-stream step.
# Pack: PACK_TESTS="test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
t model 200 $bin/test_cuda_model
timeout 60 $g bench-kernels --model 120b --tokens 1 --iters 50 2>&1 | grep -E "plain read" >> $S
timeout 60 $g bench --device cuda --random-weights 120b --pp '' --tg 32 --batch 1,32 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
ts done
rm -f $out/*.log
cat $S
