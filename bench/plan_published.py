#!/usr/bin/env python3
"""`megatron plan` against published training runs: predicted step time (and memory where the
source gives it) next to the measured values of five public tables.

What it is: every row of the tables below run through `megatron plan --json`, either as the exact
layout the authors ran (`--evaluate`) or, where the source leaves the micro-batch size and the
recomputation unstated, with the published degrees fixed and the rest chosen by the planner (its
top-ranked layout). Each published throughput is turned into seconds per iteration with the FLOP
convention its source used (stated per table), then compared with the planner's `step_seconds`:
error = (predicted - published) / published. Memory is compared where a source publishes it
(Korthikanti et al., Figure 1). A row the planner refuses (exit code 2) is kept as a miss with the
planner's message. Then three published configurations are planned with no layout flag at all, to
set the planner's own choice beside the authors'.
What it is not: a calibration. Nothing here feeds back into the planner's presets.

Usage: /usr/bin/python3 bench/plan_published.py --megatron build/megatron [--markdown]
       [--show-commands]   (about 20 s: every call is analytical)
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

GIB = 2.0 ** 30

# ---------------------------------------------------------------------------------------------
# Published data
# ---------------------------------------------------------------------------------------------

# Table A: Narayanan et al., SC'21 ("Efficient Large-Scale Language Model Training on GPU
# Clusters"), Table 1, weak scaling on A100-80GB (Selene), fp16. Launch configs of
# examples/academic_paper_scripts/sc21/run_table_1.sh. Common: seq 2048, vocab 51200 (GPT-2 BPE),
# MHA, FFN 4h, full recomputation (uniform, one layer per chunk) in every row. DDP "torch" (the
# gradient all-reduce overlapped with backward) up to 18B, Megatron's "local" DDP above.
# FLOP convention (counts the recomputed forward):
#   F96 = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)),  published seconds = F96 / (GPUs x TFLOP/s).
SC21_SEQ, SC21_VOCAB = 2048, 51200
SC21_TABLE1 = [
    # model, heads, hidden, layers, TP, PP, VPP, GPUs, MBS, GBS, TFLOP/s/GPU, DDP
    ("1.7B", 24, 2304, 24, 1, 1, None, 32, 16, 512, 137, "torch"),
    ("3.6B", 32, 3072, 30, 2, 1, None, 64, 16, 512, 138, "torch"),
    ("7.5B", 32, 4096, 36, 4, 1, None, 128, 16, 512, 142, "torch"),
    ("18B", 48, 6144, 40, 8, 1, None, 256, 8, 1024, 135, "torch"),
    ("39B", 64, 8192, 48, 8, 2, None, 512, 4, 1536, 138, "local"),
    ("76B", 80, 10240, 60, 8, 4, 3, 1024, 2, 1792, 140, "local"),
    ("145B", 96, 12288, 80, 8, 8, 2, 1536, 2, 2304, 148, "local"),
    ("310B", 128, 16384, 96, 8, 16, 2, 1920, 1, 2160, 155, "local"),
    ("530B", 128, 20480, 105, 8, 35, 3, 2520, 1, 2520, 163, "local"),
    ("1T", 160, 25600, 128, 8, 64, None, 3072, 1, 3072, 163, "local"),
]

# Table B: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
# Models", arXiv 2205.05198), A100-80GB, fp16, seq 2048, vocab 51200, DP 1, FFN 4h, MHA.
# Configs as in Calculon's validation/seqsel JSON (the paper's Table 3).
# Table 5: end-to-end iteration seconds, compared directly, in two modes:
#   "full"    : TP (no sequence parallelism) + full recomputation (uniform, 1 layer);
#   "seq+sel" : sequence parallelism + selective (core-attention) recomputation.
# Figure 1 (values as Calculon encodes them): per-GPU GiB of parameters + optimizer state and of
# activations, for "none" (TP only: no SP, no recomputation) and "seq+sel".
KORTH_SEQ, KORTH_VOCAB = 2048, 51200
KORTHIKANTI = [
    # model, heads, hidden, layers, TP, PP, VPP, GPUs, GBS, MBS,
    #   Table 5 s (full, seq+sel), Figure 1 GiB (params+opt, act none, act seq+sel)
    ("22B", 64, 6144, 48, 8, 1, None, 8, 4, 4, (1.42, 1.10), (45.56, 59.25, 9.56)),
    ("175B", 96, 12288, 96, 8, 8, 3, 64, 64, 1, (18.13, 13.75), (45.56, 66.84, 12.35)),
    ("530B", 128, 20480, 105, 8, 35, 3, 280, 280, 1, (49.05, 37.83), (31.64, 114.02, 23.08)),
    ("1T", 160, 25600, 128, 8, 64, None, 512, 512, 1, (94.42, 71.49), (32.96, 131.25, 26.56)),
]

# Table C: Megatron-LM README, H100 weak-scaling table (Megatron-Core r0.8.0, 2024-07). BF16,
# seq 4096, vocab 131072, untied embeddings, FFN 4h, MHA; --overlap-grad-reduce
# --overlap-param-gather --use-distributed-optimizer (and --tp-comm-overlap, which the planner
# does not model). DP = 48 in every row, hence CP = 1. The micro-batch size and the recomputation
# are not published: the planner chooses them (and the virtual pipeline size) with the published
# TP, PP, CP = 1, SP (TP > 1) and the distributed optimizer fixed.
# FLOP convention of that release (non-causal attention):
#   F72 = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)),  published seconds = F72 / (GPUs x TFLOP/s).
H100_SEQ, H100_VOCAB = 4096, 131072
H100_README = [
    # model, heads, hidden, layers, TP, PP, GPUs, GBS, TFLOP/s/GPU
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]

# Table D: MoE on DGX-H100 (8 x H100 per node), seq 4096.
# FLOP convention of current Megatron (causal attention, >= 2025-03), per token:
#   12 l h [f_moe k g] + 12 l h q (1 + G/a) + 6 l q s + 6 h V_padded
#   (g = 3/2 for SwiGLU; q = kv_channels x heads; G = query groups; a = heads; every layer MoE,
#   no shared expert, no MTP), i.e. 6 x active parameters + causal attention + logits.
# Both sources give a time-like value, which is what is compared: Megatron-Bridge gives tokens/s
# per GPU (published seconds = GBS s / (GPUs x tok/s/GPU)), the ModelZoo gives the step seconds.
# The formula is used only as a check that a row's TFLOP/s matches its time.
#
# Architectures: the public Hugging Face configs (dropout 0, RMSNorm, SwiGLU, RoPE, untied
# embeddings, no linear biases; all layers MoE). GPT-OSS-120B also has attention and expert
# biases, alternating 128-token sliding-window attention and attention sinks: the planner refuses
# biases with MoE ("add --disable-bias-linear with --num-experts") and has no sliding window, so
# it runs with --disable-bias-linear --add-qkv-bias and full attention in all 36 layers.
MOE_MODELS = {
    "Qwen3-30B-A3B": dict(layers=48, hidden=2048, heads=32, groups=4, kv=128, experts=128, topk=8,
                          moe_ffn=768, ffn=6144, vocab=151936, rotary_base=1e6,
                          extra=["--qk-layernorm"]),
    "Qwen3-235B-A22B": dict(layers=94, hidden=4096, heads=64, groups=4, kv=128, experts=128,
                            topk=8, moe_ffn=1536, ffn=12288, vocab=151936, rotary_base=1e6,
                            extra=["--qk-layernorm"]),
    "GPT-OSS-120B": dict(layers=36, hidden=2880, heads=64, groups=8, kv=64, experts=128, topk=4,
                         moe_ffn=2880, ffn=2880, vocab=201088, rotary_base=150000,
                         extra=["--add-qkv-bias"]),
}
MOE_SEQ = 4096
# Megatron-Bridge docs/performance-summary.md, DGX-H100 rows. "fp8" rows run --bf16 with
# --fp8-format hybrid. Tokens are force-balanced in the MoE runs. The recomputation is not
# published: evaluated without it. ETP 1 (with TP 2 and EP 32 on 32 ranks per stage it must be).
MOE_BRIDGE = [
    # model, GPUs, precision, GBS, MBS, TP, PP, CP, VPP, EP, tok/s/GPU, TFLOP/s/GPU, note
    ("GPT-OSS-120B", 64, "bf16", 512, 4, 1, 4, 1, None, 8, 5630, 153,
     "qkv bias only, no sliding window; source's GA 2 disagrees with TP1 PP4 on 64 GPUs (GA 8); "
     "published TF matches a non-gated MLP count"),
    ("Qwen3-30B-A3B", 16, "fp8", 512, 2, 1, 2, 1, 24, 8, 10494, 241, "token-drop run"),
    ("Qwen3-235B-A22B", 256, "fp8", 2048, 1, 2, 8, 1, 4, 32, 1204, 178, "token-drop run"),
]
# yanring/Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md: Qwen3-235B-A22B on 256 H100, BF16,
# GBS 2048. DeepEP and A2A dispatchers run as the plain all-to-all dispatcher. "norm, act"
# (selective recomputation of the norms and the MoE activation) runs as the planner's selective
# recomputation (core attention): the nearest it has.
MOE_MODELZOO = [
    # dispatcher, TP, EP, PP, VPP, DP, MBS, recompute, FSDP, step s, TFLOP/s/GPU
    ("DeepEP", 2, 32, 8, 4, 16, 1, "norm,act", False, 19.7, 245),
    ("DeepEP", 2, 8, 1, None, 128, 4, "full", True, 17.6, 276),
    ("A2A", 2, 8, 32, 3, 4, 1, "norm,act", False, 24.2, 200),
    ("DeepEP", 4, 8, 8, 4, 8, 1, "none", False, 29.0, 167),
]
MODELZOO_GPUS, MODELZOO_GBS = 256, 2048
# Published but not modelled: run anyway so that the planner's refusal is on record.
# Megatron-Bridge 25.09 DeepSeek-V3 (dropless), 1024 H100, FP8, GBS 8192, MBS 1, TP2 PP8 VPP4
# EP64, 1297 tok/s/GPU, 338 TFLOP/s/GPU. Architecture from its Hugging Face config: 61 layers
# (the first 3 dense), hidden 7168, 128 heads with multi-latent attention, 256 routed experts
# top-8 of width 2048 plus one shared expert, vocab 129280, one MTP layer.
DEEPSEEK_V3 = dict(gpus=1024, gbs=8192, mbs=1, tp=2, pp=8, vpp=4, ep=64, tok_s=1297, tf=338)

# ---------------------------------------------------------------------------------------------
# FLOP conventions
# ---------------------------------------------------------------------------------------------


def flops_sc21_96(B, s, l, h, V):
    """SC'21 with full recomputation counted: 96 B s l h^2 (1 + s/6h + V/16lh)."""
    return 96.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (16.0 * l * h))


def flops_model_72(B, s, l, h, V):
    """Model FLOPs, non-causal (Megatron <= 2025-02): 72 B s l h^2 (1 + s/6h + V/12lh)."""
    return 72.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (12.0 * l * h))


def padded_vocab(V, tp):
    """Megatron pads the vocabulary to a multiple of 128 x TP."""
    m = 128 * tp
    return (V + m - 1) // m * m


def flops_megatron_moe(arch, B, s, tp):
    """Current Megatron (causal attention) for an all-MoE GQA model with SwiGLU experts."""
    L, h, q = arch["layers"], arch["hidden"], arch["kv"] * arch["heads"]
    per_token = (12.0 * L * h * arch["moe_ffn"] * arch["topk"] * 1.5 +
                 12.0 * L * h * q * (1 + arch["groups"] / arch["heads"]) +
                 6.0 * L * q * s +
                 6.0 * h * padded_vocab(arch["vocab"], tp))
    return per_token * B * s


# ---------------------------------------------------------------------------------------------
# Running the planner
# ---------------------------------------------------------------------------------------------


def cluster_flags(gpus):
    """Nodes x GPUs per node = GPUs: 8-GPU nodes where possible, else one node of all."""
    if gpus % 8 == 0:
        return ["--num-nodes", str(gpus // 8), "--gpus-per-node", "8"]
    return ["--num-nodes", "1", "--gpus-per-node", str(gpus)]


def gpt_flags(heads, hidden, layers, seq, vocab):
    return ["--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads",
            str(heads), "--seq-length", str(seq), "--max-position-embeddings", str(seq),
            "--vocab-size", str(vocab)]


def moe_flags(arch):
    return ["--num-layers", str(arch["layers"]), "--hidden-size", str(arch["hidden"]),
            "--num-attention-heads", str(arch["heads"]), "--group-query-attention",
            "--num-query-groups", str(arch["groups"]), "--kv-channels", str(arch["kv"]),
            "--ffn-hidden-size", str(arch["ffn"]), "--num-experts", str(arch["experts"]),
            "--moe-router-topk", str(arch["topk"]), "--moe-ffn-hidden-size", str(arch["moe_ffn"]),
            "--moe-token-dispatcher-type", "alltoall", "--vocab-size", str(arch["vocab"]),
            "--seq-length", str(MOE_SEQ), "--max-position-embeddings", str(MOE_SEQ),
            "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
            "--rotary-base", str(arch["rotary_base"]), "--untie-embeddings-and-output-weights",
            "--disable-bias-linear", "--hidden-dropout", "0", "--attention-dropout", "0"
            ] + arch["extra"]


def degree_flags(tp=1, pp=1, vpp=None, mbs=None, sp=False, cp=None, ep=None, etp=None):
    out = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)]
    if vpp:
        out += ["--num-virtual-stages-per-pipeline-rank", str(vpp)]
    if mbs:
        out += ["--micro-batch-size", str(mbs)]
    if sp and tp > 1:
        out += ["--sequence-parallel"]
    if cp:
        out += ["--context-parallel-size", str(cp)]
    if ep:
        out += ["--expert-model-parallel-size", str(ep)]
    if etp:
        out += ["--expert-tensor-parallel-size", str(etp)]
    return out


FULL_RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]
SELECTIVE = ["--recompute-granularity", "selective"]


class Planner:
    def __init__(self, megatron):
        self.megatron = megatron
        self.commands = []  # (label, command line) of every call, for --show-commands

    def run(self, label, gpu, gpus, flags, gbs, evaluate=True):
        """The top layout of `megatron plan --json`, or the planner's refusal message."""
        cmd = ([self.megatron, "plan", "--gpu", gpu] + cluster_flags(gpus) + flags +
               ["--global-batch-size", str(gbs), "--json"] + (["--evaluate"] if evaluate else []))
        self.commands.append((label, " ".join(shlex.quote(c) for c in cmd)))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            lines = [x for x in (proc.stderr + proc.stdout).strip().splitlines() if x.strip()]
            msg = lines[-1] if lines else "no message"
            return {"refused": "exit %d: %s" % (proc.returncode, msg)}
        doc = json.loads(proc.stdout)
        top = doc["layouts"][0]
        top["candidates"] = doc["candidates"]
        return top


# ---------------------------------------------------------------------------------------------
# Rows and formatting
# ---------------------------------------------------------------------------------------------

TERMS = [("compute", "comp"), ("tp_comm", "tp"), ("cp_comm", "cp"), ("ep_comm", "ep"),
         ("pp_comm", "pp"), ("bubble", "bub"), ("dp_comm", "dp"), ("optimizer", "opt"),
         ("overhead", "ovh")]


# Parts of "compute", where the planner reports them.
COMPUTE_PARTS = [("gemm", "gemm"), ("attention", "attn"), ("elementwise", "ew"),
                 ("embedding_and_head", "head")]


def breakdown(top):
    """Shares (%) of the predicted step, terms of 0.5% and more:
    'comp 83 [gemm 70 attn 9 ew 4] tp 9 bub 6'."""
    sec, step = top["seconds"], top["step_seconds"]

    def shares(terms):
        parts = [(sec[k] / step * 100, short) for k, short in terms if k in sec]
        return " ".join("%s %.0f" % (short, x) for x, short in parts if x >= 0.5)

    out = []
    for key, short in TERMS:
        x = sec.get(key, 0) / step * 100
        if x < 0.5:
            continue
        out.append("%s %.0f" % (short, x))
        if key == "compute" and any(k in sec for k, _ in COMPUTE_PARTS):
            out.append("[%s]" % shares(COMPUTE_PARTS))
    return " ".join(out)


def pct(x):
    return "" if x is None else "%+.1f%%" % (100 * x)


def num(x, fmt="%.2f"):
    return "" if x is None else fmt % x


def time_row(model, gpus, layout, pub_tf, pub_s, top, note=""):
    """A row of a time table; `top` is the planner's top layout or its refusal."""
    row = {"model": model, "gpus": gpus, "layout": layout, "pub_tf": pub_tf, "pub_s": pub_s,
           "pred_s": None, "err": None, "mem": "", "terms": "", "note": note}
    if "refused" in top:
        row["note"] = ("MISS: " + top["refused"] + (" | " + note if note else ""))
        return row
    row["layout"] = top["name"]
    row["pred_s"] = top["step_seconds"]
    row["err"] = (row["pred_s"] - pub_s) / pub_s
    row["mem"] = "%.1f%s" % (top["memory_bytes"]["total"] / GIB, "" if top["fits"] else " (!)")
    row["terms"] = breakdown(top)
    return row


TIME_HEADER = ["Model", "GPUs", "Layout (planner's name)", "Pub TF/GPU", "Pub s", "Pred s",
               "Error", "Pred mem GiB", "Predicted step (%)", "Note"]


def time_cells(r):
    pub_tf = r["pub_tf"] if isinstance(r["pub_tf"], str) else num(r["pub_tf"], "%g")
    return [r["model"], str(r["gpus"]), r["layout"], pub_tf, num(r["pub_s"]),
            num(r["pred_s"]), pct(r["err"]), r["mem"], r["terms"], r["note"]]


def render(title, header, rows, markdown, notes=()):
    out = []
    if markdown:
        out.append("### " + title)
        out.append("")
        for n in notes:
            out.append(n)
        if notes:
            out.append("")
        esc = [[c.replace("|", "\\|") for c in row] for row in [header] + rows]
        out.append("| " + " | ".join(esc[0]) + " |")
        out.append("|" + "|".join("---" for _ in header) + "|")
        for row in esc[1:]:
            out.append("| " + " | ".join(row) + " |")
    else:
        out.append("== " + title)
        for n in notes:
            out.append("   " + n)
        widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
        for row in [header] + rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    out.append("")
    return "\n".join(out)


def summary(errors):
    errs = [abs(e) for e in errors if e is not None]
    if not errs:
        return "n/a", "n/a", 0
    return "%.1f%%" % (100 * statistics.median(errs)), "%.1f%%" % (100 * max(errs)), len(errs)


# ---------------------------------------------------------------------------------------------
# The tables
# ---------------------------------------------------------------------------------------------


def sc21_flags(heads, hidden, layers):
    return gpt_flags(heads, hidden, layers, SC21_SEQ, SC21_VOCAB) + ["--fp16"]


def korth_flags(heads, hidden, layers):
    return gpt_flags(heads, hidden, layers, KORTH_SEQ, KORTH_VOCAB) + ["--fp16"]


def h100_flags(heads, hidden, layers):
    return (gpt_flags(heads, hidden, layers, H100_SEQ, H100_VOCAB) +
            ["--untie-embeddings-and-output-weights", "--bf16"])


def table_sc21(p, keep):
    rows = []
    for (name, heads, hidden, layers, tp, pp, vpp, gpus, mbs, gbs, tf, ddp) in SC21_TABLE1:
        pub_s = flops_sc21_96(gbs, SC21_SEQ, layers, hidden, SC21_VOCAB) / (gpus * tf * 1e12)
        flags = (sc21_flags(heads, hidden, layers) + degree_flags(tp, pp, vpp, mbs) +
                 FULL_RECOMPUTE + (["--overlap-grad-reduce"] if ddp == "torch" else []))
        top = p.run("SC21 " + name, "a100-80", gpus, flags, gbs)
        keep[("sc21", name)] = (top, pub_s)
        rows.append(time_row(name, gpus, "tp%d pp%d vpp%s mbs%d" % (tp, pp, vpp or 1, mbs), tf,
                             pub_s, top, "DDP %s" % ddp))
    return rows


def table_korthikanti(p, keep):
    time_rows, mem_rows = [], []
    for (name, heads, hidden, layers, tp, pp, vpp, gpus, gbs, mbs, times, mem) in KORTHIKANTI:
        base = korth_flags(heads, hidden, layers)
        modes = [("full", degree_flags(tp, pp, vpp, mbs) + FULL_RECOMPUTE, times[0]),
                 ("seq+sel", degree_flags(tp, pp, vpp, mbs, sp=True) + SELECTIVE, times[1])]
        for mode, flags, pub_s in modes:
            top = p.run("Korthikanti %s %s" % (name, mode), "a100-80", gpus, base + flags, gbs)
            keep[("korth", name, mode)] = (top, pub_s)
            derived_tf = flops_model_72(gbs, KORTH_SEQ, layers, hidden, KORTH_VOCAB) / (
                gpus * pub_s * 1e12)
            time_rows.append(time_row("%s %s" % (name, mode), gpus,
                                      "tp%d pp%d vpp%s mbs%d" % (tp, pp, vpp or 1, mbs),
                                      "(%.0f)" % derived_tf, pub_s, top))
        # Figure 1: "none" (TP only, no recomputation) and "seq+sel".
        none = p.run("Korthikanti %s none (memory)" % name, "a100-80", gpus,
                     base + degree_flags(tp, pp, vpp, mbs), gbs)
        seqsel = keep[("korth", name, "seq+sel")][0]
        for label, top, pub_w, pub_a in (("none", none, mem[0], mem[1]),
                                         ("seq+sel", seqsel, mem[0], mem[2])):
            if "refused" in top:
                mem_rows.append({"cells": [name, label, num(pub_w), "", "", num(pub_a), "", "",
                                           "MISS: " + top["refused"]], "errs": []})
                continue
            w = top["memory_bytes"]["weights_and_optimizer"] / GIB
            a = top["memory_bytes"]["activations"] / GIB
            ew, ea = (w - pub_w) / pub_w, (a - pub_a) / pub_a
            mem_rows.append({"cells": [name, label, num(pub_w), num(w), pct(ew), num(pub_a),
                                       num(a), pct(ea), top["name"]], "errs": [ew, ea]})
    return time_rows, mem_rows


def table_h100(p, keep):
    rows = []
    for (name, heads, hidden, layers, tp, pp, gpus, gbs, tf) in H100_README:
        pub_s = flops_model_72(gbs, H100_SEQ, layers, hidden, H100_VOCAB) / (gpus * tf * 1e12)
        flags = (h100_flags(heads, hidden, layers) + degree_flags(tp, pp, sp=True, cp=1) +
                 ["--use-distributed-optimizer", "--overlap-grad-reduce",
                  "--overlap-param-gather"])
        top = p.run("H100 " + name, "h100-80", gpus, flags, gbs, evaluate=False)
        keep[("h100", name)] = (top, pub_s)
        rows.append(time_row(name, gpus, "tp%d pp%d dp%d" % (tp, pp, gpus // (tp * pp)), tf,
                             pub_s, top, "mbs/rc/vpp: planner"))
    return rows


def table_moe(p, keep):
    rows = []
    for (model, gpus, prec, gbs, mbs, tp, pp, cp, vpp, ep, tok_s, tf, note) in MOE_BRIDGE:
        arch = MOE_MODELS[model]
        pub_s = gbs * MOE_SEQ / (gpus * tok_s)
        check = flops_megatron_moe(arch, gbs, MOE_SEQ, tp) / (gpus * pub_s) / 1e12
        flags = (moe_flags(arch) + ["--bf16"] + (["--fp8-format", "hybrid"] if prec == "fp8"
                                                 else []) +
                 degree_flags(tp, pp, vpp, mbs, sp=True, cp=cp, ep=ep, etp=1) +
                 ["--use-distributed-optimizer", "--overlap-grad-reduce",
                  "--overlap-param-gather"])
        top = p.run("Bridge " + model, "h100-80", gpus, flags, gbs)
        keep[("bridge", model)] = (top, pub_s)
        rows.append(time_row("%s %s (Bridge)" % (model, prec.upper()), gpus,
                             "tp%d pp%d vpp%s ep%d mbs%d" % (tp, pp, vpp or 1, ep, mbs), tf, pub_s,
                             top, "%d tok/s/GPU; formula TF %.0f; %s" % (tok_s, check, note)))
    arch = MOE_MODELS["Qwen3-235B-A22B"]
    for (disp, tp, ep, pp, vpp, dp, mbs, rc, fsdp, step, tf) in MOE_MODELZOO:
        assert tp * pp * dp == MODELZOO_GPUS
        check = flops_megatron_moe(arch, MODELZOO_GBS, MOE_SEQ, tp) / (MODELZOO_GPUS * step) / 1e12
        flags = moe_flags(arch) + ["--bf16"] + degree_flags(tp, pp, vpp, mbs, sp=True, ep=ep,
                                                            etp=1)
        flags += {"full": FULL_RECOMPUTE, "norm,act": SELECTIVE, "none": []}[rc]
        if fsdp:
            flags += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                      "optim_grads_params"]
        else:
            flags += ["--use-distributed-optimizer"]
        flags += ["--overlap-grad-reduce", "--overlap-param-gather"]
        top = p.run("ModelZoo Qwen3-235B %s tp%d ep%d pp%d" % (disp, tp, ep, pp), "h100-80",
                    MODELZOO_GPUS, flags, MODELZOO_GBS)
        keep[("zoo", disp, tp, ep, pp)] = (top, step)
        layout = "tp%d pp%d vpp%s ep%d dp%d mbs%d rc %s%s" % (tp, pp, vpp or 1, ep, dp, mbs, rc,
                                                             " fsdp" if fsdp else "")
        note = "%s; formula TF %.0f" % (disp, check)
        if rc == "norm,act":
            note += "; rc as selective"
        rows.append(time_row("Qwen3-235B-A22B BF16 (ModelZoo)", MODELZOO_GPUS, layout, tf, step,
                             top, note))
    # DeepSeek-V3: multi-latent attention, run only to record the refusal.
    d = DEEPSEEK_V3
    flags = ["--num-layers", "61", "--hidden-size", "7168", "--num-attention-heads", "128",
             "--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512",
             "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128",
             "--num-experts", "256", "--moe-router-topk", "8", "--moe-ffn-hidden-size", "2048",
             "--moe-shared-expert-intermediate-size", "2048", "--ffn-hidden-size", "18432",
             "--moe-layer-freq", "([0]*3+[1]*58)", "--vocab-size", "129280",
             "--seq-length", str(MOE_SEQ), "--max-position-embeddings", str(MOE_SEQ), "--swiglu",
             "--normalization", "RMSNorm", "--position-embedding-type", "rope",
             "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--bf16",
             "--fp8-format", "hybrid"] + degree_flags(d["tp"], d["pp"], d["vpp"], d["mbs"],
                                                      sp=True, ep=d["ep"], etp=1)
    top = p.run("Bridge DeepSeek-V3", "h100-80", d["gpus"], flags, d["gbs"])
    pub_s = d["gbs"] * MOE_SEQ / (d["gpus"] * d["tok_s"])
    rows.append(time_row("DeepSeek-V3 FP8 (Bridge)", d["gpus"], "tp2 pp8 vpp4 ep64 mbs1",
                         d["tf"], pub_s, top,
                         "not modelled: multi-latent attention (also MTP, uneven 61-layer "
                         "pipeline)"))
    return rows


def must_show(p, keep, markdown):
    """Three published configurations planned with no layout flag: the planner's own choice."""
    cases = []
    # Korthikanti 175B on 64 A100, GBS 64.
    name, heads, hidden, layers = KORTHIKANTI[1][:4]
    free = p.run("free Korthikanti 175B", "a100-80", 64, korth_flags(heads, hidden, layers), 64,
                 evaluate=False)
    cases.append(("Korthikanti 175B, 64 A100, GBS 64", "seq+sel: tp8 pp8 vpp3 mbs1",
                  keep[("korth", "175B", "seq+sel")], free))
    # SC'21 530B on 2520 A100, GBS 2520.
    row = SC21_TABLE1[8]
    free = p.run("free SC21 530B", "a100-80", row[7], sc21_flags(*row[1:4]), row[9],
                 evaluate=False)
    cases.append(("SC'21 530B, 2520 A100, GBS 2520", "tp8 pp35 vpp3 mbs1 full",
                  keep[("sc21", "530B")], free))
    # H100 README 70B on 768 H100, GBS 384.
    row = H100_README[4]
    free = p.run("free H100 70B", "h100-80", row[6], h100_flags(*row[1:4]), row[7],
                 evaluate=False)
    cases.append(("H100 README 70B, 768 H100, GBS 384", "tp8 pp2 dp48 (mbs, rc: planner)",
                  keep[("h100", "70B")], free))
    header = ["Configuration", "Authors' layout", "Published s", "Authors' layout pred s",
              "Authors' pred error", "Planner's best layout", "Best pred s", "Best vs authors' pred",
              "Best mem GiB", "Candidates"]
    rows = []
    for label, authors, (auth_top, pub_s), free in cases:
        auth_s = auth_top.get("step_seconds")
        cells = [label, authors + (" = " + auth_top["name"] if "name" in auth_top else ""),
                 num(pub_s), num(auth_s), pct((auth_s - pub_s) / pub_s if auth_s else None)]
        if "refused" in free:
            cells += ["MISS: " + free["refused"], "", "", "", ""]
        else:
            cells += [free["name"], num(free["step_seconds"]),
                      pct((free["step_seconds"] - auth_s) / auth_s if auth_s else None),
                      "%.1f" % (free["memory_bytes"]["total"] / GIB), str(free["candidates"])]
        rows.append(cells)
    return render("The planner's own choice (no layout flag given)", header, rows, markdown,
                  notes=["Planned with the model, cluster and global batch only (no --evaluate, "
                         "no TP/PP/CP/VPP/MBS/recompute/sharding flag)."])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megatron", default="build/megatron", help="the megatron binary")
    ap.add_argument("--markdown", action="store_true", help="GitHub markdown tables")
    ap.add_argument("--show-commands", action="store_true",
                    help="also print every planner command line")
    args = ap.parse_args()
    if not os.access(args.megatron, os.X_OK):
        sys.exit("no executable %s (build first, or pass --megatron)" % args.megatron)
    p = Planner(args.megatron)
    keep = {}
    md = args.markdown
    out = []
    all_errs = {}
    legend = ("Error = (predicted - published) / published. Pred mem GiB: the planner's total "
              "memory of the most loaded rank, (!) = over the device's 80 GiB. Predicted step "
              "(%): shares of the planner's step_seconds: comp = compute [gemm, attn = core "
              "attention, ew = elementwise, head = embedding and output layer], tp/cp/ep/pp = "
              "exposed tensor/context/expert/pipeline communication, bub = pipeline bubble, "
              "dp = exposed data-parallel gradient reduction and parameter gathers, opt = "
              "optimizer step.")
    out.append(("## `megatron plan` against published runs\n\n" + legend + "\n") if md
               else legend + "\n")

    sc21 = table_sc21(p, keep)
    out.append(render(
        "A. SC'21 Table 1 (A100-80GB, fp16, full recomputation)", TIME_HEADER,
        [time_cells(r) for r in sc21], md,
        notes=["Published s = 96 B s l h^2 (1 + s/6h + V/16lh) / (GPUs x TFLOP/s/GPU); "
               "layouts evaluated as published (--evaluate)."]))
    all_errs["A. SC'21 Table 1"] = [r["err"] for r in sc21]

    korth_t, korth_m = table_korthikanti(p, keep)
    out.append(render(
        "B. Korthikanti et al. 2022, Table 5 (A100-80GB, fp16)", TIME_HEADER,
        [time_cells(r) for r in korth_t], md,
        notes=["Published s: Table 5 iteration times, compared directly; layouts evaluated as "
               "published. Pub TF/GPU in parentheses: derived from the time with "
               "72 B s l h^2 (1 + s/6h + V/12lh) (model FLOPs, not published as such)."]))
    all_errs["B. Korthikanti Table 5"] = [r["err"] for r in korth_t]
    out.append(render(
        "B'. Korthikanti et al. 2022, Figure 1 memory per GPU (GiB = 2^30 bytes)",
        ["Model", "Mode", "Pub params+opt", "Pred", "Error", "Pub activations", "Pred",
         "Error", "Layout"], [r["cells"] for r in korth_m], md,
        notes=["Pred: the planner's memory_bytes.weights_and_optimizer and .activations of the "
               "most loaded rank; 'none' = TP only, no SP, no recomputation."]))
    mem_errs = [e for r in korth_m for e in r["errs"]]

    h100 = table_h100(p, keep)
    out.append(render(
        "C. Megatron-LM README H100 table (BF16, seq 4096)", TIME_HEADER,
        [time_cells(r) for r in h100], md,
        notes=["Published s = 72 B s l h^2 (1 + s/6h + V/12lh) / (GPUs x TFLOP/s/GPU). MBS and "
               "recomputation are not published: TP, PP, CP = 1, SP and the distributed "
               "optimizer are fixed and the planner chooses MBS, recomputation and VPP (its "
               "top-ranked layout, no --evaluate)."]))
    all_errs["C. H100 README"] = [r["err"] for r in h100]

    moe = table_moe(p, keep)
    out.append(render(
        "D. MoE on H100 (Megatron-Bridge, Megatron-MoE-ModelZoo)", TIME_HEADER,
        [time_cells(r) for r in moe], md,
        notes=["Published s: Bridge GBS x 4096 / (GPUs x tok/s/GPU); ModelZoo step seconds as "
               "published. 'formula TF' = current Megatron FLOPs (12 l h f_moe k 3/2 + "
               "12 l h q (1 + G/a) + 6 l q s + 6 h V per token) over GPUs x published s, a "
               "check of the published TF/GPU. Layouts evaluated as published (--evaluate); "
               "Bridge rows without recomputation (not published)."]))
    all_errs["D. MoE"] = [r["err"] for r in moe]

    out.append(must_show(p, keep, md))

    srows = []
    everything = []
    for name, errs in all_errs.items():
        med, mx, n = summary(errs)
        misses = sum(1 for e in errs if e is None)
        srows.append([name, str(n), str(misses), med, mx])
        everything += errs
    med, mx, n = summary(everything)
    srows.append(["All time rows", str(n), str(sum(1 for e in everything if e is None)), med, mx])
    med, mx, n = summary(mem_errs)
    mem_misses = sum(1 for r in korth_m if not r["errs"])
    srows.append(["Korthikanti Figure 1 memory (params+opt and activations)", str(n),
                  str(mem_misses), med, mx])
    out.append(render("Summary: |error| of the predicted step time (and memory)",
                      ["Table", "Rows compared", "Misses", "Median |error|", "Max |error|"],
                      srows, md))
    print("\n".join(out))
    if args.show_commands:
        print("Commands:" if not md else "### Commands\n")
        for label, cmd in p.commands:
            print(("- %s: `%s`" if md else "%s: %s") % (label, cmd))


if __name__ == "__main__":
    main()
