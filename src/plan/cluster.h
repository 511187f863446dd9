// Cluster: what the planner knows of the machines a job runs on, as peaks and link speeds.
//
// A device has a peak rate per GEMM dtype, a memory size and bandwidth, and a GEMM efficiency
// that grows with the GEMM's size: efficiency(F) = e_max F / (F + F_half) for a GEMM of F FLOPs
// (small GEMMs cannot fill the device; F_half is the size at half of e_max). Devices sit in
// nodes; a collective inside a node runs over the intra-node fabric (NVLink, or shared memory
// for CPU ranks), one that crosses nodes over each device's share of the network (SimuMax's rule:
// a group spanning nodes moves its bytes through the NICs). Presets carry public spec-sheet
// peaks; efficiencies are stated priors (README of each preset in cluster.cpp), not fitted to the
// validation tables. The `cpu` cluster is measured on this machine instead (plan/cpu_calibration).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megatron::plan {

// One link class: bytes / (bandwidth x efficiency) + latency per message.
struct Link {
  double bandwidth = 0;   // bytes/s per device, one direction
  double latency = 0;     // s per collective step
  double efficiency = 1;  // achieved share of `bandwidth` for large messages
};

// The elementwise work of one transformer layer and micro-batch on one rank: norms, residual
// adds with their dropout, biases, the MLP's activation, RoPE.
struct ElementwiseWork {
  int64_t h_rows = 0;     // tokens of the h-wide rows (local under sequence parallelism)
  int64_t tokens = 0;     // tokens of the GEMM-side rows
  int64_t hidden = 0;     // h
  int64_t ffn = 0;        // the MLP's per-token width on this rank (f / tp; experts: their rows)
  int64_t qkv = 0;        // the QKV projection's width on this rank
  bool gated = false;     // SwiGLU (else GELU)
  bool layernorm = true;  // LayerNorm (else RMSNorm)
  bool bias = true;       // linear biases
  bool rope = false;
  double dropout = 0;  // hidden dropout probability
  bool backward = false;
};

struct Device {
  std::string name;
  double peak_16bit = 0;              // FLOP/s, bf16/fp16 GEMMs (dense)
  double peak_fp8 = 0;                // FLOP/s, fp8 GEMMs (0: no fp8 units; fp8 runs at peak_16bit)
  double peak_fp32 = 0;               // FLOP/s, fp32 GEMMs
  double memory_bytes = 0;            // usable memory per device
  double memory_bw = 0;               // bytes/s (HBM, or DRAM for CPUs)
  double gemm_e_max = 0.8;            // GEMM efficiency of very large GEMMs
  double gemm_e_max_fp8 = 0.65;       // the same for fp8 GEMMs (their share of peak_fp8)
  double gemm_f_half = 1e9;           // FLOPs of a GEMM at half of gemm_e_max
  double attention_efficiency = 0.5;  // fused attention's share of the GEMM efficiency
  double memory_efficiency = 0.8;     // elementwise kernels' share of memory_bw
  // Flash attention: the kernel skips the masked half of causal scores and keeps no [s, s]
  // scores for backward; the 2021-22 Megatron runs on A100 materialised every score (fused
  // softmax over [s, s]) and kept the softmax output and its dropout mask.
  bool flash_attention = true;
  double runtime_bytes = 0;  // resident besides tensors: context, libraries, comm buffers
  double fragmentation = 0;  // allocator overhead as a share of activation memory
  // Seconds of a layer's elementwise work (the cpu cluster measures its kernels); null: bytes at
  // memory_bw x memory_efficiency.
  std::function<double(const ElementwiseWork&)> elementwise_time;
  // Measured overrides (the cpu cluster): GEMM seconds for (m, n, k, ta, tb, dtype); null: the
  // efficiency curve.
  std::function<double(int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype)> gemm_time;
  // Seconds of one attention forward / backward for (b, np, sq, skv, hn, causal, dropout
  // probability, dtype); null: FLOPs at attention_efficiency.
  std::function<double(int64_t b, int64_t np, int64_t sq, int64_t skv, int64_t hn, bool causal,
                       double dropout, DType dtype, bool backward)>
      attention_time;
};

struct Cluster {
  Device device;
  int64_t nodes = 1;
  int64_t devices_per_node = 8;
  Link intra;  // inside a node
  Link inter;  // across nodes, per device
  // Ranks per core (>= 1): CPU ranks sharing cores, whose measured times already include the
  // sharing; a rank waiting in a pipeline bubble leaves its core to the others.
  double oversubscription = 1;
  // Fixed seconds per iteration besides the model (data loading, logging, the step's launch).
  double iteration_overhead = 0;
  int64_t world() const { return nodes * devices_per_node; }
};

// The presets by --gpu name: a100-80, h100-80, h200, b200 (cpu is measured: cpu_calibration.h).
std::vector<std::string> gpu_preset_names();
// Refuses an unknown name, listing the known ones.
Device gpu_preset(const std::string& name);
// The default links of a preset's node (NVLink generation) and network (NDR/HDR per GPU).
Link preset_intra_link(const std::string& name);
Link preset_inter_link(const std::string& name);

// Peak FLOP/s of the device for GEMMs in `dtype` (fp8 when `fp8`).
double peak_flops(const Device& d, DType dtype, bool fp8);
// Seconds of C[m, n] = op(A) op(B) with K = k on the device (measured where the device has it).
double gemm_seconds(const Device& d, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype,
                    bool fp8);

}  // namespace megatron::plan
