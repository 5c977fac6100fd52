# Session 18, round 2: s18r1.sh's round (serve, synchronous then --async-scheduling) on binaries
# whose --async-scheduling plans N+1 after the join (take N's drawn ids, plan, launch, then N's
# bookkeeping); the engine alone on this host twice each.
ENGINE_RUNS="0 1 0 1" source tools/gpu/rounds/s18r1.sh
