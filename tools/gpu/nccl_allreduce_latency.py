# All-reduce latency through PyTorch + NCCL, one process per GPU (a first reading before our own tool).
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    for nbytes in [5760, 11520, 23040, 92160, 368640, 1 << 20, 4 << 20, 16 << 20]:
        for dt in [torch.bfloat16, torch.float32]:
            x = torch.ones(nbytes // x_size(dt), dtype=dt, device="cuda")
            for _ in range(20): dist.all_reduce(x)
            torch.cuda.synchronize()
            # graph-captured loop of 50 all-reduces: what a decode graph would see
            s = torch.cuda.Stream(); g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(s):
                dist.all_reduce(x); torch.cuda.synchronize()
                with torch.cuda.graph(g):
                    for _ in range(50): dist.all_reduce(x)
            e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
            g.replay(); torch.cuda.synchronize()
            e0.record(); 
            for _ in range(4): g.replay()
            e1.record(); torch.cuda.synchronize()
            us = e0.elapsed_time(e1) * 1000 / 200
            if rank == 0: print(f"allreduce {str(dt)[6:]:9s} {nbytes:>9d} B  {us:7.2f} us (graph)", flush=True)
    dist.destroy_process_group()
def x_size(dt): return 2 if dt == torch.bfloat16 else 4
if __name__ == "__main__":
    w = torch.cuda.device_count(); print("gpus", w, "nccl", torch.cuda.nccl.version())
    mp.spawn(run, args=(w,), nprocs=w)
