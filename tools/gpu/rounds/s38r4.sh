# Session 38, round 4: the per-token attention range under compute-sanitizer (memcheck, racecheck;
# small shapes); serving's decode passes against bench's steps at the same batch (120b, bf16
# dense layers): bench tg128 at 32 and 64 sequences (512-token prompts, as bench-serve's), and
# serving at 32 and at 64 streams each in its own server, so each timeline holds one size.
# Pack: PACK_TESTS=test_cuda_kernels tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts sanitize
sanitize '*FlashAttentionMixedPass*:*AttentionPerTokenRange*' memcheck racecheck
ts bench
RUNS=2 b step $g 120b 128 32
RUNS=2 b step $g 120b 128 64
ts serve
srv 18100 120b -- 32
srv 18101 120b -- 64
ts done
