"""All-reduce a vector across MLX ranks and check the sum.

Runs under tb (`tbctl apply -f manifests/trainingjob-mlx-allreduce.yaml`) or under mlx.launch
(`mlx.launch --hostfile <(tbctl hostfile JOB) -- python mlx_allreduce.py`). Either way the
ranks find each other through MLX's own environment (MLX_RANK with MLX_HOSTFILE for the ring,
MLX_IBV_DEVICES for JACCL), and the group size is MLX's: mx.distributed.init().size().
Under tb, TB_WORLD_SIZE says how many ranks tb started; the group must be that large.

Rank r contributes r + 1 to every element, so after all_sum every element must be
1 + 2 + ... + size. Exits non-zero on a wrong sum or a wrong group size.
"""

import os
import sys

import mlx.core as mx


def main() -> int:
    # tb and mlx.launch set MLX_IBV_DEVICES for JACCL and MLX_HOSTFILE for the ring. strict:
    # a rank told to join a group must fail without one, not run alone.
    backend = "jaccl" if "MLX_IBV_DEVICES" in os.environ else "ring"
    distributed = "MLX_HOSTFILE" in os.environ or "MLX_IBV_DEVICES" in os.environ
    group = mx.distributed.init(strict=distributed, backend=backend)
    rank, size = group.rank(), group.size()
    tb_size = os.environ.get("TB_WORLD_SIZE")
    if tb_size is not None and size != int(tb_size):
        print(f"rank {rank}: MLX group has {size} ranks, tb started {tb_size}", file=sys.stderr)
        return 1

    x = mx.full((1024,), rank + 1, dtype=mx.float32)
    total = mx.distributed.all_sum(x, group=group)
    mx.eval(total)

    expected = size * (size + 1) / 2
    ok = bool(mx.all(total == expected).item())
    verdict = "ok" if ok else "MISMATCH"
    print(f"rank {rank} of {size}: all_sum = {total[0].item():g}, expected {expected:g}: {verdict}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
