# Session 38, round 5: where serving's decode steps go (s38r4: serving's decode passes run at
# bench's step time, 12.9 ms at 32 sequences and 17.2 at 64): the graphed step traced kernel by
# kernel at 32 and 64 sequences, 120b, bf16 dense layers (the reports come back whole).
# Pack: EXTRA_BINS=build/libgptoss_kernel_trace.so tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
export TRACE_GREP="replay to replay|sum of adds"
trace_bench step 32 --random-weights 120b
trace_bench step 64 --random-weights 120b
ts done
