"""A plain torchrun-style script (no Pacer import): env:// init from RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, one Gloo all-reduce. Used by torchrun_compat_test.py.

  torchrun_worker.py OUT_DIR

Writes OUT_DIR/rank<RANK>.<TORCHELASTIC_RESTART_COUNT>.json after the first all-reduce. In the
first start (restart count 0) rank 1 then idles (the test kills it with SIGKILL) while the others
wait in a second all-reduce that rank 1 never joins, as survivors of a dead rank do. From the
second start on every rank exits 0 after the all-reduce.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    out = sys.argv[1]
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")  # env:// : exactly what a script written for torchrun does
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    info = {"rank": rank, "world": world, "sum": t.item(), "pid": os.getpid(), "restart": restart,
            "master_port": os.environ["MASTER_PORT"], "local_rank": int(os.environ["LOCAL_RANK"])}
    tmp = os.path.join(out, f"rank{rank}.{restart}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.rename(tmp, tmp[:-4])
    if restart == 0:
        if rank == 1:
            while True:
                time.sleep(60)
        dist.all_reduce(t)  # blocks: rank 1 never comes; fails or is stopped by the agent
        sys.exit(1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
