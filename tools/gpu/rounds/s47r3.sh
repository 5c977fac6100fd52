# Session 47, round 3: cuBLASLt's fp8 GEMM (e4m3 weights and activations, outer-vector scales) at
# qkv / o_proj / lm_head shapes and 16-64 tokens against its bf16 GEMM (bench-kernels' dense tables).
# Pack: PACK_TESTS= tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
for tok in 32 64 16; do
  left 240 && { timeout 110 $g bench-kernels --model 120b --tokens $tok --iters 50 > $out/bk$tok.txt 2>&1
  grep -E "cublaslt|fp8 outer|^\| (qkv|o_proj|lm_head) " $out/bk$tok.txt | grep -v "^| router" >> $S; }
done
