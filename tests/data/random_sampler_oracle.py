#!/usr/bin/env python3
"""Oracle for --dataloader-type cyclic: Megatron's MegatronPretrainingRandomSampler, restated.

Restates the sampler's iteration from Megatron-LM's documented semantics, as an iterator like the
original (not as the position map the C++ side uses): each pass computes the epoch and the offset
into it from the consumed samples, draws the epoch's order with PyTorch's own torch.randperm from a
generator seeded with the epoch, and yields full micro-batches, adding micro-batch x data-parallel
size to the consumed samples per batch; passes repeat for as long as batches are asked for, as
Megatron's cyclic_iter does. A resumed run is a fresh sampler started from the consumed samples.

Usage: random_sampler_oracle.py --spec spec.json --out result.json
spec: {"cases": [{"name", "total", "mbs", "dp", "sharding", "consumed", "batches"}],
       "perms": [[n, seed], ...]}
result: {"cases": {name: [[batches of rank 0], [batches of rank 1], ...]} (dataset indices),
         "perms": [torch.randperm(n) after manual_seed(seed), ...]}
"""

import argparse
import json

import torch


def batches_of_rank(total, mbs, dp, rank, sharding, consumed, count):
    out = []
    mbdp = mbs * dp
    while len(out) < count:
        active = total - total % mbdp
        epoch, in_epoch = divmod(consumed, active)
        assert in_epoch % mbdp == 0
        g = torch.Generator()
        g.manual_seed(epoch)
        if sharding:
            bucket = (total // mbdp) * mbs
            order = torch.randperm(bucket, generator=g).tolist()
            walk = [rank * bucket + x for x in order[in_epoch // dp:]]
        else:
            order = torch.randperm((total // mbs) * mbs, generator=g).tolist()
            walk = order[in_epoch:][rank::dp]
        batch = []
        for idx in walk:
            batch.append(idx)
            if len(batch) == mbs:
                consumed += mbdp
                out.append(batch)
                batch = []
                if len(out) == count:
                    break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.spec) as f:
        spec = json.load(f)
    result = {"cases": {}, "perms": []}
    for c in spec["cases"]:
        result["cases"][c["name"]] = [
            batches_of_rank(c["total"], c["mbs"], c["dp"], r, c["sharding"], c["consumed"],
                            c["batches"])
            for r in range(c["dp"])
        ]
    for n, seed in spec["perms"]:
        g = torch.Generator()
        g.manual_seed(seed)
        result["perms"].append(torch.randperm(n, generator=g).tolist())
    with open(a.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
