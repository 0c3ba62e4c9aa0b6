"""All-reduce a vector across the ranks of a tb TrainingJob and check the sum.

tb starts one copy per rank with MLX's distributed environment set (MLX_RANK, MLX_HOSTFILE, ...)
and TB_RANK / TB_WORLD_SIZE. Rank r contributes r + 1 to every element, so after all_sum every
element must be 1 + 2 + ... + world_size. Exits non-zero on a wrong sum or a wrong group size.
"""

import os
import sys

import mlx.core as mx


def main() -> int:
    want_size = int(os.environ.get("TB_WORLD_SIZE", "1"))
    # tb sets MLX_IBV_DEVICES for JACCL and MLX_HOSTFILE for the ring. strict: a multi-rank job
    # without a working backend must fail, not run alone.
    backend = "jaccl" if "MLX_IBV_DEVICES" in os.environ else "ring"
    group = mx.distributed.init(strict=want_size > 1, backend=backend)
    rank, size = group.rank(), group.size()
    if size != want_size:
        print(f"rank {rank}: MLX group has {size} ranks, tb started {want_size}", file=sys.stderr)
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
