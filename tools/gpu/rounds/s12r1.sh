source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t k 240 $K
t m 240 $bin/test_cuda_model
ts "spec 20b"
MODELS=20b OUT=$out/spec20 bash tools/gpu/spec_round.sh --prebuilt $bin >> $S 2>&1
ts done
cat $S
