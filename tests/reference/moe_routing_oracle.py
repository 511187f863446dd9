#!/usr/bin/env python3
"""fp64 oracle for the MoE router math (src/transformer/moe/routing.h).

Restates Megatron-core's router (r0.14 router.py / moe_utils.py: topk_routing_with_score_function,
group_limited_topk, apply_router_token_dropping, sinkhorn, the aux / seq-aux / z-loss formulas,
get_updated_expert_bias) in float64 PyTorch with autograd, and writes one JSON file of cases:
for each router configuration, the logits [T, E], a random upstream gradient G [T, E], and what
Megatron computes: the routing probabilities and map, d(sum(probs * G))/d(logits), the losses and
their gradients with respect to the logits, and the expert-bias update.

What it is not: the C++ code's test by itself (tests/transformer/test_moe_routing.cpp reads the
file and compares), nor a copy of Megatron's code: the formulas are written out from the
reference, with torch.topk only where Megatron uses it. Logits are drawn tie-free (distinct
values far apart relative to fp64 rounding), since torch.topk promises no order among equals.

Usage: python3 tests/reference/moe_routing_oracle.py --out FILE [--seed 7]
"""

import argparse
import json
import math
import os
import sys

import torch

T, B, E, K = 12, 3, 8, 2  # tokens (s-major rows: s * B + b), sequences, experts, top-k


def topk_route(logits, cfg, bias):
    k, groups, gtopk = cfg["topk"], cfg.get("num_groups", 0), cfg.get("group_topk", 0)

    def compute_topk(scores):
        if not gtopk:
            return torch.topk(scores, k, dim=1)
        per = E // groups
        group_scores = scores.view(-1, groups, per).topk(k // gtopk, dim=-1)[0].sum(-1)
        chosen = torch.topk(group_scores, gtopk, dim=-1)[1]
        mask = torch.zeros_like(group_scores).scatter(1, chosen, 1.0)
        mask = mask.unsqueeze(-1).expand(-1, groups, per).reshape(-1, E).bool()
        return torch.topk(scores.masked_fill(~mask, float("-inf")), k, dim=-1)

    if cfg["score"] == "softmax" and not cfg.get("pre_softmax"):
        vals, idx = compute_topk(logits)
        probs = torch.softmax(vals, dim=-1)
    elif cfg["score"] == "softmax":
        scores = torch.softmax(logits, dim=-1)
        probs, idx = compute_topk(scores)
    else:
        scores = torch.sigmoid(logits)
        if bias is not None:
            _, idx = compute_topk(scores + bias)
            sel = torch.gather(scores, 1, idx)
        else:
            sel, idx = compute_topk(scores)
        probs = sel / (sel.sum(-1, keepdim=True) + 1e-20) if k > 1 else sel
    if cfg.get("scaling"):
        probs = probs * cfg["scaling"]
    dense = torch.zeros_like(logits).scatter(1, idx, probs)
    routing_map = torch.zeros_like(logits).scatter(1, idx, 1.0).bool()
    return dense, routing_map


def sinkhorn(cost, tol=1e-4):
    cost = torch.exp(cost)
    d0 = torch.ones(cost.size(0), dtype=cost.dtype)
    d1 = torch.ones(cost.size(1), dtype=cost.dtype)
    err, d1_old = 1e9, d1
    while err > tol:
        d0 = (1 / d0.size(0)) / (torch.sum(d1 * cost, 1) + 1e-8)
        d1 = (1 / d1.size(0)) / (torch.sum(d0.unsqueeze(1) * cost, 0) + 1e-8)
        err = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
    return d1 * cost * d0.unsqueeze(1)


def sinkhorn_route(logits, cfg, training):
    k = cfg["topk"]
    act = torch.sigmoid(logits) if k == 1 else torch.softmax(logits, dim=-1)
    if training:
        with torch.no_grad():
            _, idx = torch.topk(sinkhorn(logits.detach()), k, dim=1)
    else:
        _, idx = torch.topk(act, k, dim=1)
    routing_map = torch.zeros_like(logits).scatter(1, idx, 1.0).bool()
    return act * routing_map, routing_map


def drop(probs, routing_map, cfg):
    """apply_router_token_dropping; the capacity top-k along tokens breaks no ties here: the
    probs policy sees distinct values, the position policy is restated as 'earliest first'."""
    T_, E_ = probs.shape
    cap = min(T_, math.ceil(T_ * cfg["topk"] / E_ * cfg["capacity"]))
    keep = torch.zeros_like(probs, dtype=torch.bool)
    for e in range(E_):
        if cfg.get("policy", "probs") == "probs":
            col = probs[:, e].detach()
            order = sorted(range(T_), key=lambda t: (-col[t].item(), t))
        else:
            col = routing_map[:, e]
            order = sorted(range(T_), key=lambda t: (-int(col[t]), t))
        for t in order[:cap]:
            keep[t, e] = True
    final = keep if cfg.get("pad") else routing_map & keep
    return probs * final, final, cap


def aux_scores(logits, cfg):
    if cfg["score"] == "sigmoid":
        s = torch.sigmoid(logits)
        s = s / (s.sum(-1, keepdim=True) + 1e-20)
    else:
        s = torch.softmax(logits, dim=-1)
    _, idx = torch.topk(s, cfg["topk"], dim=1)
    return s, torch.zeros_like(s).scatter(1, idx, 1.0)


def switch_loss(P, counts, total, k, coeff):
    """E / (k T^2) sum (sum_t P) * counts, E the number of experts (also for the per-sequence
    [S, B * E] view, whose columns are B sequences' experts)."""
    return (P.sum(0) * counts).sum() * (E * coeff / (k * total * total))


def case(name, cfg, gen, training=True):
    logits = (torch.randperm(T * E, generator=gen).double() / (T * E) * 6 - 3).view(T, E)
    logits = logits + torch.rand(T, E, generator=gen, dtype=torch.float64) * 1e-3
    G = torch.randn(T, E, generator=gen, dtype=torch.float64)
    bias = None
    if cfg.get("bias"):
        bias = torch.randn(E, generator=gen, dtype=torch.float64) * 0.1
    x = logits.clone().requires_grad_(True)
    if cfg.get("sinkhorn"):
        probs, rmap = sinkhorn_route(x, cfg, training)
    else:
        probs, rmap = topk_route(x, cfg, bias)
    out = {"name": name, "cfg": cfg, "training": training, "logits": logits.flatten().tolist(),
           "G": G.flatten().tolist(), "bias": [] if bias is None else bias.tolist()}
    if cfg.get("capacity"):
        probs, rmap, cap = drop(probs, rmap, cfg)
        out["capacity"] = cap
    (probs * G).sum().backward()
    out["probs"] = probs.detach().flatten().tolist()
    out["map"] = rmap.int().flatten().tolist()
    out["dlogits"] = x.grad.flatten().tolist()
    # Load-balancing losses on the same logits (TP = CP = 1): values and d/dlogits.
    coeff = 0.3
    for kind in ("aux", "seq_aux", "z"):
        y = logits.clone().requires_grad_(True)
        if kind == "z":
            loss = coeff * (torch.logsumexp(y, dim=-1) ** 2).mean()
        else:
            P, amap = aux_scores(y, cfg)
            if kind == "aux":
                loss = switch_loss(P, amap.sum(0), T, cfg["topk"], coeff)
            else:  # per sequence: columns b * E + e of the [S, B * E] view, averaged over B
                S = T // B
                loss = switch_loss(P.reshape(S, B * E), amap.reshape(S, B * E).sum(0), S,
                                   cfg["topk"], coeff) / B
        loss.backward()
        out[kind + "_loss"] = loss.item()
        out["d" + kind] = y.grad.flatten().tolist()
    # The aux-loss-free update from this batch's (post-dropping) counts.
    if bias is not None:
        counts = rmap.double().sum(0)
        out["bias_after"] = (bias + torch.sign(counts.mean() - counts) * 1e-3).tolist()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    sm, sg = {"score": "softmax", "topk": K}, {"score": "sigmoid", "topk": K}
    cases = [
        case("softmax after top-k", sm, gen),
        case("softmax before top-k", dict(sm, pre_softmax=True), gen),
        case("softmax before top-k, k 1", dict(sm, pre_softmax=True, topk=1), gen),
        case("sigmoid", sg, gen),
        case("sigmoid, k 1", dict(sg, topk=1), gen),
        case("sigmoid + expert bias", dict(sg, bias=True), gen),
        case("scaling factor 2.5", dict(sg, scaling=2.5), gen),
        case("group-limited 4 groups, 2 used", dict(sm, pre_softmax=True, num_groups=4,
                                                    group_topk=2, topk=3), gen),
        case("group-limited sigmoid + bias", dict(sg, bias=True, num_groups=2, group_topk=1),
             gen),
        case("sinkhorn k 2 (training)", dict(sm, sinkhorn=True), gen),
        case("sinkhorn k 1 (training)", dict(sm, sinkhorn=True, topk=1), gen),
        case("sinkhorn k 2 (evaluation)", dict(sm, sinkhorn=True), gen, training=False),
        case("capacity 1.0, probs", dict(sm, capacity=1.0), gen),
        case("capacity 0.5, position", dict(sm, capacity=0.5, policy="position"), gen),
        case("capacity 1.0, probs, padded", dict(sm, capacity=1.0, pad=True), gen),
        case("capacity 0.5, position, padded", dict(sm, capacity=0.5, policy="position",
                                                    pad=True), gen),
    ]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"T": T, "B": B, "E": E, "coeff": 0.3, "cases": cases}, f)
    print(f"moe_routing_oracle: {len(cases)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
