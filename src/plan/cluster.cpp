// The GPU presets. Peaks are the vendors' dense tensor-core figures (never the sparse ones):
// A100 312 TFLOP/s bf16, H100/H200 989 bf16 and 1979 fp8, B200 2250 bf16 and 4500 fp8 (HGX
// B200 at 1000 W). Memory sizes and bandwidths are the SXM parts'. Nodes are 8-GPU HGX boards:
// NVLink 3/4/5 carry 300/450/900 GB/s per direction per GPU; the network is one NIC per GPU
// (HDR 200 Gb/s on A100 systems such as Selene, NDR 400 Gb/s on H100/H200/B200 systems).
//
// Efficiencies are priors, stated here once: cuBLAS reaches ~88% of the A100's peak and ~80% of
// Hopper's on large bf16 GEMMs (larger tiles need larger problems: F_half grows with the peak),
// cuBLASLt's fp8 GEMMs ~65% of the fp8 peak (~1300 of 1979 TFLOP/s on H100);
// fused attention runs at ~70% of the GEMM rate on the same device; elementwise kernels stream at
// ~80% of HBM bandwidth; NCCL's bus bandwidth reaches ~80% of NVLink's and ~90% of the NIC's.
// The runtime's resident bytes outside tensors (CUDA context, cuBLAS workspaces, NCCL buffers)
// are ~2 GiB and the caching allocator's fragmentation ~10% of activations (PyTorch's usual
// reserved-over-allocated ratio in Megatron runs).
#include "plan/cluster.h"

#include <algorithm>

#include "core/error.h"

namespace megatron::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kT = 1e12;

Device base(const std::string& name, double p16, double p8, double p32, double mem, double bw,
            double e_max, double f_half) {
  Device d;
  d.name = name;
  d.peak_16bit = p16;
  d.peak_fp8 = p8;
  d.peak_fp32 = p32;
  d.memory_bytes = mem;
  d.memory_bw = bw;
  d.gemm_e_max = e_max;
  d.gemm_f_half = f_half;
  d.attention_efficiency = 0.7;
  d.memory_efficiency = 0.8;
  d.runtime_bytes = 2 * kGiB;
  d.fragmentation = 0.10;
  return d;
}

}  // namespace

std::vector<std::string> gpu_preset_names() {
  return {"a100-80", "h100-80", "h200", "b200"};
}

Device gpu_preset(const std::string& name) {
  if (name == "a100-80") {
    Device d = base(name, 312 * kT, 0, 19.5 * kT, 80 * kGiB, 2.039e12, 0.88, 0.5e9);
    d.flash_attention = false;  // Megatron's 2021-22 fused softmax computed every score
    return d;
  }
  if (name == "h100-80")
    return base(name, 989 * kT, 1979 * kT, 67 * kT, 80 * kGiB, 3.35e12, 0.8, 1.5e9);
  if (name == "h200") return base(name, 989 * kT, 1979 * kT, 67 * kT, 141e9, 4.8e12, 0.8, 1.5e9);
  if (name == "b200") return base(name, 2250 * kT, 4500 * kT, 80 * kT, 180e9, 7.7e12, 0.75, 3e9);
  std::string known;
  for (const std::string& n : gpu_preset_names()) known += n + ", ";
  MEGATRON_CHECK(false, "--gpu ", name, " is not a known device; use one of ", known,
                 "or cpu (this machine, measured)");
  return {};
}

Link preset_intra_link(const std::string& name) {
  const double nvlink = name == "a100-80" ? 300e9 : name == "b200" ? 900e9 : 450e9;
  return Link{nvlink, 10e-6, 0.8};
}

Link preset_inter_link(const std::string& name) {
  return Link{name == "a100-80" ? 25e9 : 50e9, 20e-6, 0.9};
}

double peak_flops(const Device& d, DType dtype, bool fp8) {
  if (fp8 && d.peak_fp8 > 0) return d.peak_fp8;
  return is_half(dtype) ? d.peak_16bit : d.peak_fp32;
}

double gemm_seconds(const Device& d, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype,
                    bool fp8) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  if (d.gemm_time) return d.gemm_time(m, n, k, ta, tb, dtype);
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double e_max = fp8 && d.peak_fp8 > 0 ? d.gemm_e_max_fp8 : d.gemm_e_max;
  const double eff = e_max * flops / (flops + d.gemm_f_half);
  return flops / (peak_flops(d, dtype, fp8) * std::max(eff, 1e-3));
}

}  // namespace megatron::plan
