#!/usr/bin/env bash
# Issue 12 on the 2-GPU machine (NVLink): the tensor-parallel tests, the all-reduce latency table
# (NCCL vs the peer-memory kernels), `gptoss bench` at TP=1 and TP=2 (both expert
# shardings), and the same greedy tokens from TP=1, TP=2 in one process (threads), and TP=2 as two
# processes bootstrapped from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT with NCCL forced onto its
# network transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; one-shot off) and with the one-shot
# kernel over CUDA IPC. Logs land in $OUT; a summary prints last.
#
#   tools/gpu/tp_round.sh BIN_DIR    # BIN_DIR: prebuilt gptoss, test_cuda_tp (test_cuda_kernels), lib/, data/tiny-gptoss
# NCCL comes from the PyTorch wheel on the GPU machine (gptoss loads libnccl.so.2 at run time);
# NCCL_LIB overrides its directory.
set -uo pipefail
bin=$(cd "$1" && pwd); out=${OUT:-/tmp/tp-round}; mkdir -p "$out"
nccl_lib=${NCCL_LIB:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib}
export LD_LIBRARY_PATH="$bin/lib:$nccl_lib:${LD_LIBRARY_PATH:-}" GPTOSS_TEST_DATA_DIR="$bin/data"
export NCCL_NVLS_ENABLE=0  # never NVLink SHARP / multicast on the shared machines
g=$bin/gptoss
declare -a summary
status() { summary+=("| $1 | $2 |"); }
log() { echo "== $*"; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -5

log "test_cuda_tp (collectives, TP=2 vs TP=1 models, graph vs eager)"
timeout 500 "$bin/test_cuda_tp" --gtest_color=no >"$out/test_cuda_tp.log" 2>&1; rc=$?
grep -E "rel err|greedy|graph|FAILED|Failure|Expected|Which is|error|^\[  (PASSED|FAILED)" "$out/test_cuda_tp.log" | head -60
status test_cuda_tp "$([ $rc = 0 ] && echo "PASS ($(grep -c '^\[       OK' "$out/test_cuda_tp.log") tests)" || echo "FAIL rc=$rc")"

if [ -x "$bin/test_cuda_kernels" ]; then  # moe_route grew an expert range: the TP=1 MoE kernels must not move
  log "test_cuda_kernels (MoE)"
  timeout 300 "$bin/test_cuda_kernels" --gtest_color=no --gtest_filter='*Moe*:*Route*' >"$out/test_cuda_kernels_moe.log" 2>&1; rc=$?
  grep -E "FAILED|Failure|^\[  (PASSED|FAILED)" "$out/test_cuda_kernels_moe.log" | head -10
  status "test_cuda_kernels MoE" "$([ $rc = 0 ] && echo PASS || echo "FAIL rc=$rc")"
fi

log "bench-allreduce --gpus 2"
timeout 200 "$g" bench-allreduce --gpus 2 2>&1 | tee "$out/allreduce.md"
status bench-allreduce "$([ ${PIPESTATUS[0]} = 0 ] && echo done || echo FAIL)"
# Every peer-memory kernel over the whole range (LL and its fused row form to 1 MiB, the
# experimental two-shot kernel to 32 MiB), to place the thresholds.
GPTOSS_ALLREDUCE_ONESHOT_MAX=1048576 GPTOSS_ALLREDUCE_TWOSHOT_MAX=33554432 \
  timeout 300 "$g" bench-allreduce --gpus 2 2>&1 | tee "$out/allreduce_all.md"
status "bench-allreduce (all kernels)" "$([ ${PIPESTATUS[0]} = 0 ] && echo done || echo FAIL)"

bench() {  # NAME FLAGS...
  local name=$1; shift
  log "bench 120b $name"
  timeout 420 "$g" bench --device cuda --random-weights 120b --pp 512,2048 --tg 128 --runs 2 "$@" >"$out/bench_$name.log" 2>&1
  local rc=$?
  grep -E "^\|" "$out/bench_$name.log" | grep -v -- "---"
  [ $rc = 0 ] || tail -5 "$out/bench_$name.log"
  status "bench $name" "$([ $rc = 0 ] && echo done || echo "FAIL rc=$rc")"
}
bench tp1
bench tp2_intermediate --tp 2 --tp-expert-sharding intermediate
bench tp2_expert --tp 2 --tp-expert-sharding expert
GPTOSS_ALLREDUCE_ONESHOT_MAX=0 bench tp2_nccl_only --tp 2 --tp-expert-sharding intermediate
GPTOSS_ALLREDUCE_TWOSHOT_MAX=33554432 bench tp2_twoshot --tp 2 --tp-expert-sharding intermediate

# Greedy tokens: TP=1, TP=2 threads, TP=2 two processes (network transport, then IPC one-shot).
gen=(generate --device cuda --random-weights 20b --weights-seed 3 --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 48
     --temperature 0 --ignore-eos --print-ids)
ids() { grep -E '^[0-9]+(,[0-9]+)+$' "$1" | tail -1; }
log "generate TP=1 / TP=2 (threads)"
timeout 300 "$g" "${gen[@]}" >"$out/gen_tp1.log" 2>&1
timeout 300 "$g" "${gen[@]}" --tp 2 >"$out/gen_tp2.log" 2>&1
two_procs() {  # NAME EXTRA-ENV...
  local name=$1; shift
  log "generate TP=2, two processes: $name"
  local port=$((29500 + RANDOM % 500))
  for r in 1 0; do
    env "$@" RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_DEBUG=INFO \
      timeout 300 "$g" "${gen[@]}" --tp 2 >"$out/gen_${name}_rank$r.log" 2>&1 &
  done
  wait
  grep -hE "via NET|via P2P|via SHM|NET/Socket|NET/IB" "$out/gen_${name}_rank0.log" | head -3
}
two_procs net NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 GPTOSS_ALLREDUCE_ONESHOT_MAX=0
two_procs ipc
t1=$(ids "$out/gen_tp1.log")
for f in gen_tp2 gen_net_rank0 gen_ipc_rank0; do
  t=$(ids "$out/$f.log")
  if [ -n "$t1" ] && [ "$t" = "$t1" ]; then r=same; else r="DIFFER (see $out/$f.log)"; fi
  echo "$f: ${t:0:80}"
  status "tokens $f vs TP=1" "$r"
done
echo "gen_tp1: ${t1:0:80}"

echo; echo "| step | result |"; echo "|---|---|"
printf '%s\n' "${summary[@]}"
