# (Ran the binaries of branch s30-l2-prefetch: GPTOSS_L2_PREFETCH exists there only.)
# Session 30, call 2 (branch s30-l2-prefetch): does a layer's expert weights in L2 before gate_up
# pay? The bound: GPTOSS_CUDA_SKIP=route_once (every layer reuses layer 0's routing, so routing_
# names exactly this layer's experts) with and without prefetching them from attention's start
# ('e'), qkv's ('E'), down's experts too ('d'); the bulk engine or lines (evict_last). Then the same
# prefetch outside route_once (routing_ then holds the previous layer's experts: a poor prediction,
# its cost). 120b fp8 tg64 x1 (and 20b fp8).
source tools/gpu/rounds/prelude.sh
pf() {  # NAME MODEL ENV...
  local name=$1 m=$2; shift 2
  echo "== $m $name" >> $S
  env "$@" timeout 100 $g bench --device cuda --random-weights $m --dense-dtype fp8 --pp '' --tg 64 --batch 1 \
    --runs 3 2>&1 | grep -E "^\| random|rror" >> $S
}
ts start
for rep in 1 2; do
  pf off 120b X=0
  pf ro 120b GPTOSS_CUDA_SKIP=route_once
  pf ro_e 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=e
  pf ro_E 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=E
  pf ro_ed 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=ed
  pf ro_Ed 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=Ed
  pf ro_e_last 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=e GPTOSS_L2_PREFETCH_MODE=last
  pf ro_E_lines 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=E GPTOSS_L2_PREFETCH_MODE=lines
  pf ro_e_b64 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=e GPTOSS_L2_PREFETCH_BLOCKS=64
  pf ro_oe 120b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=oe
  pf prev_e 120b GPTOSS_L2_PREFETCH=e
done
pf ro 20b GPTOSS_CUDA_SKIP=route_once
pf ro_e 20b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=e
pf ro_E 20b GPTOSS_CUDA_SKIP=route_once GPTOSS_L2_PREFETCH=E
pf ro 20b GPTOSS_CUDA_SKIP=route_once
ts done
cat $S
