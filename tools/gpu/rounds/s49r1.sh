# Session 49, round 1 (any GPU): is the 8-64-token warp walk's gap to its plain read on the H200
# (~12%, against ~4% on the H100: s48r1) a limit of each SM? bench-kernels' new --sm-limit N runs
# its kernels on N SMs with the others held idle (kernels/misc/sm_blocker.h), so an H100 at 92 SMs
# asks of each SM what an H200's 4.8 TB/s over 132 does. At 32 and 64 tokens: main at all SMs and
# at 112 / 92 / 76; at 92 also the walk without its activations' shared-memory reads (no_act) and
# with its ring refilled 4 slots at once (lg4). On an H200: main at 132 / 110, no_act and lg4 at
# 132, then s48r2's per-kernel tables. (With --sm-limit, bench-kernels times only the expert rows:
# the first form of this round hung in cuBLASLt's rows, whose grids assume every SM.)
# Pack: PACK_TESTS= EXTRA_BINS="build/diag/gptoss_walk_lg4 build/diag/gptoss_walk_no_act build/libgptoss_kernel_trace.so build/diag/gptoss_router_clocks"
source tools/gpu/rounds/prelude.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
rows="gate_up \+ down|plain read.*(stream \(memory|walk's grid, 8|2 blocks an SM)|\(mxfp4\).*\(fragments\)|sm-limit"
bk() {  # NAME BINARY TOKENS LIMIT
  timeout 60 $2 bench-kernels --model 120b --tokens $3 --iters 20 --sm-limit $4 > $out/bk$3_$1_$4.txt 2>&1
  echo "== bench-kernels $3 tokens, $1, --sm-limit $4 (rc $?)" >> $S
  grep -E "$rows" $out/bk$3_$1_$4.txt | head -12 >> $S
}
if [[ $name == *H200* ]]; then lims="0 110"; else lims="92 112 76"; fi
for tk in 64 32; do
  for l in $lims; do left 300 && bk main $g $tk $l; done
  if [[ $name == *H200* ]]; then l=0; else l=92; fi
  for v in no_act lg4; do left 300 && bk $v $bin/gptoss_walk_$v $tk $l; done
done
ts "sm-limit study done"
if [[ $name == *H200* ]]; then
  export TRACE_GREP="replay to replay|sum of adds"
  left 250 && trace_bench fp8 1 --random-weights 120b --dense-dtype fp8
  left 290 && trace_bench bf16 32 --random-weights 120b
  left 320 && trace_bench mxfp4 1 --random-weights 120b --mxfp4-layers all
  left 350 && trace_bench bf16 64 --random-weights 120b
fi
ts done
