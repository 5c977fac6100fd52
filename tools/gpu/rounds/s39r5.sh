# Session 39, round 5 (prepared in the thirty-ninth session, which had no machine; not yet run; after
# s39r3 has passed): version 5's warp-specialized kernel against the mbarrier kernel, in bench-kernels
# (gate_up + down a layer at 120b 4096 / 8192 tokens, 20b 2048 / 8192) and in the model's prefill
# (pp4096 and pp8192 passes, alternating); ~8 minutes. s39r6 has its Nsight Compute.
# Pack: as s39r3 (tools/gpu/pack.sh)
source tools/gpu/rounds/prelude.sh
ts "bench-kernels, gate_up + down a layer (the mbarrier kernel, then warp-specialized)"
for m_tk in 120b:4096 120b:8192 20b:2048 20b:8192; do
  m=${m_tk%%:*} tk=${m_tk##*:}
  bk_v5 "$m $tk mbar" $m $tk "mbar"
  GPTOSS_EXPERT_GEMM_V5_WS=1 bk_v5 "$m $tk ws-tma" $m $tk "ws-tma"
  GPTOSS_EXPERT_GEMM_V5_WS=2 bk_v5 "$m $tk ws-cpasync" $m $tk "ws-cpasync"
done
ts "prefill A/B"
pp_ab GPTOSS_EXPERT_GEMM_V5_WS "0 1 2" 4096,8192 120b  # (120b only: issue 14 lacks only its targets; 20b in bench-kernels above)
ts done
