// Measurements of this machine for the planner's `cpu` cluster (see plan_calibration.h).
#include "train/cpu_calibration.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/threads.h"
#include "core/timer.h"
#include "tensor/allocator.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "train/memory_report.h"

namespace megatron {

namespace {

// Median seconds of `fn` over runs totalling about `budget` seconds (at least `min_runs`), after
// one warm-up call.
template <typename Fn>
double median_seconds(Fn&& fn, double budget, size_t min_runs) {
  fn();
  std::vector<double> times;
  Timer total;
  do {
    Timer t;
    fn();
    times.push_back(t.elapsed());
  } while (times.size() < min_runs || (total.elapsed() < budget && times.size() < 50));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Runs `fn` with `threads` OpenMP threads, restoring the count after.
template <typename Fn>
double with_threads(int threads, Fn&& fn) {
  const int before = num_threads();
  set_num_threads(threads);
  const double v = fn();
  set_num_threads(before);
  return v;
}

struct Measured {
  double budget = 0.03;  // seconds per shape
  size_t min_runs = 3;
  int threads = 1;
  double stretch = 1;  // ranks per core beyond one: each rank's share of a core
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int>, double> gemms;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, double, int, bool>, double>
      attention;

  double gemm(int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype) {
    const auto key = std::make_tuple(m, n, k, ta, tb, static_cast<int>(dtype));
    auto it = gemms.find(key);
    if (it != gemms.end()) return it->second;
    const double s = with_threads(threads, [&] {
      Tensor a = Tensor::full(ta ? Shape{k, m} : Shape{m, k}, 0.5, dtype);
      Tensor b = Tensor::full(tb ? Shape{n, k} : Shape{k, n}, 0.25, dtype);
      Tensor c = Tensor::zeros({m, n}, DType::kF32);
      return median_seconds([&] { ops::matmul(c, a, ta, b, tb); }, budget, min_runs);
    });
    return gemms[key] = s * stretch;
  }

  std::map<std::vector<int64_t>, double> elementwise;

  // The layer's elementwise kernels as the trainer calls them, on tensors of the work's shapes
  // (f32 activations): two norms, the residual adds with their dropout, the biases and the MLP's
  // activation; backward their gradients.
  double layer_elementwise(const plan::ElementwiseWork& w) {
    const std::vector<int64_t> key = {w.h_rows,    w.tokens, w.hidden,
                                      w.ffn,       w.qkv,    w.gated,
                                      w.layernorm, w.bias,   static_cast<int64_t>(w.dropout * 1e6),
                                      w.backward};
    auto it = elementwise.find(key);
    if (it != elementwise.end()) return it->second;
    const double s = with_threads(threads, [&] {
      const int64_t glu = w.gated ? 2 : 1;
      Tensor x = Tensor::full({w.h_rows, w.hidden}, 0.5, DType::kF32), y = x.clone(),
             dy = x.clone();
      Tensor weight = Tensor::full({w.hidden}, 1.0, DType::kF32), bias = weight.clone();
      Tensor dweight = Tensor::zeros({w.hidden}), dbias = Tensor::zeros({w.hidden});
      Tensor mean = Tensor::zeros({w.h_rows}), rstd = Tensor::full({w.h_rows}, 1.0, DType::kF32);
      Tensor pre = Tensor::full({w.tokens, glu * w.ffn}, 0.1, DType::kF32);
      Tensor act = Tensor::zeros({w.tokens, w.ffn}), dact = act.clone(), dpre = pre.clone();
      Tensor qkv = Tensor::zeros({w.tokens, w.qkv});
      Tensor bias_ffn = Tensor::zeros({glu * w.ffn}), bias_qkv = Tensor::zeros({w.qkv});
      const float p = static_cast<float>(w.dropout);
      auto forward = [&] {
        for (int i = 0; i < 2; ++i) {
          if (w.layernorm)
            ops::layernorm_forward(y, mean, rstd, x, weight, bias, 1e-5f);
          else
            ops::rmsnorm_forward(y, rstd, x, weight, 1e-5f);
          if (p > 0) ops::dropout_forward(y, y, p, 1, static_cast<uint64_t>(i));
          ops::add_inplace(y, x);
          if (w.bias) ops::bias_add(y, bias);
        }
        if (w.bias) {
          ops::bias_add(qkv, bias_qkv);
          ops::bias_add(pre, bias_ffn);
        }
        if (w.gated)
          ops::swiglu_forward(act, pre);
        else
          ops::gelu_forward(act, pre, false);
      };
      auto backward = [&] {
        for (int i = 0; i < 2; ++i) {
          if (w.layernorm)
            ops::layernorm_backward(y, dweight, dbias, dy, x, weight, mean, rstd);
          else
            ops::rmsnorm_backward(y, dweight, dy, x, weight, rstd);
          if (p > 0) ops::dropout_backward(y, y, p, 1, static_cast<uint64_t>(i));
          ops::add_inplace(y, dy);
          if (w.bias) ops::bias_backward(dbias, dy);
        }
        if (w.bias) {
          ops::bias_backward(bias_qkv, qkv);
          ops::bias_backward(bias_ffn, pre);
        }
        if (w.gated)
          ops::swiglu_backward(dpre, dact, pre);
        else
          ops::gelu_backward(dpre, dact, pre, false);
      };
      return w.backward ? median_seconds(backward, budget, min_runs)
                        : median_seconds(forward, budget, min_runs);
    });
    return elementwise[key] = s * stretch;
  }

  double attend(int64_t b, int64_t np, int64_t sq, int64_t skv, int64_t hn, bool causal,
                double dropout, DType dtype, bool backward) {
    const auto key =
        std::make_tuple(b, np, sq, skv, hn, causal, dropout, static_cast<int>(dtype), backward);
    auto it = attention.find(key);
    if (it != attention.end()) return it->second;
    const double s = with_threads(threads, [&] {
      // Activations are f32 in this runtime; a context-parallel rank's queries are the last
      // sq of the skv keys (its share of the causal work on average).
      Tensor q = Tensor::full({sq, b, np, hn}, 0.01, DType::kF32);
      Tensor k = Tensor::full({skv, b, np, hn}, 0.02, DType::kF32);
      Tensor v = Tensor::full({skv, b, np, hn}, 0.03, DType::kF32);
      Tensor out = Tensor::zeros({sq, b, np, hn}, DType::kF32);
      Tensor lse = Tensor::zeros({b, np, sq}, DType::kF32);
      ops::AttentionSpec spec;
      spec.causal = causal;
      spec.scale = 0.125f;
      spec.q_offset = (skv - sq) / 2;
      spec.precision = is_half(dtype) ? dtype : DType::kF32;
      spec.dropout = static_cast<float>(dropout);
      const auto qv = ops::attention_view(q, np), kv = ops::attention_view(k, np),
                 vv = ops::attention_view(v, np);
      if (!backward)
        return median_seconds([&] { ops::attention_forward(out, lse, qv, kv, vv, spec); }, budget,
                              min_runs);
      ops::attention_forward(out, lse, qv, kv, vv, spec);
      Tensor dq = Tensor::zeros(q.shape()), dk = Tensor::zeros(k.shape()),
             dv = Tensor::zeros(v.shape()), dout = Tensor::full(out.shape(), 0.1, DType::kF32);
      const auto dqv = ops::attention_view(dq, np), dkv = ops::attention_view(dk, np),
                 dvv = ops::attention_view(dv, np);
      return median_seconds(
          [&] {
            ops::attention_backward(dqv, dkv, dvv, Tensor(), dout, qv, kv, vv, out, lse, spec);
          },
          budget, min_runs);
    });
    return attention[key] = s * stretch;
  }
};

// Bytes/s of an elementwise pass (out += a: 12 bytes per element) over two buffers of `bytes`
// together (32 MB: past the caches of a core).
double memory_bandwidth(int threads, int64_t bytes, double budget) {
  return with_threads(threads, [&] {
    const int64_t n = std::max<int64_t>(bytes / 8, 4096);
    Tensor a = Tensor::full({n}, 1.0, DType::kF32), b = Tensor::full({n}, 2.0, DType::kF32);
    return 12.0 * static_cast<double>(n) /
           median_seconds([&] { ops::add_inplace(a, b); }, budget, 3);
  });
}

// Latency and bandwidth of all-reduces on `group`, fitted to two sizes.
// The large message has `large` floats (a gradient bucket's order of size: a small one sits in the
// caches and reads too fast).
plan::Link measure_link(ProcessGroup& group, double budget, int64_t large) {
  auto time_of = [&](int64_t n) {
    Tensor t = Tensor::full({n}, 1.0, DType::kF32);
    return median_seconds([&] { group.all_reduce(t); }, budget, 5);
  };
  const int64_t small = 256;
  const double ts = time_of(small), tl = time_of(large);
  const double p = static_cast<double>(group.size());
  const double steps = 2 * (p - 1), volume = 2 * (p - 1) / p;
  plan::Link link;
  link.latency = ts / steps;
  link.bandwidth = volume * 4.0 * static_cast<double>(large - small) / std::max(tl - ts, 1e-9);
  link.efficiency = 1;
  return link;
}

}  // namespace

plan::Cluster calibrate_cpu_cluster(const CpuCalibration& o) {
  const int64_t ranks = o.ranks;
  ProcessGroup* world = o.group;
  // A rank's resident bytes besides its tensors: this binary, its libraries and MPI as loaded,
  // i.e. what is resident less the live tensors (the blocks cached for reuse handed back first).
  allocator_for(Device::kCPU).release_cached();
  const double runtime_bytes = resident_mb() * 1048576.0 - static_cast<double>(live_tensor_bytes());
  auto measured = std::make_shared<Measured>();
  measured->threads = std::max(1, o.threads);
  measured->budget = o.budget;
  measured->min_runs = o.min_runs;
  measured->stretch = std::max(1.0, o.stretch);
  plan::Cluster c;
  plan::Device& d = c.device;
  d.name = "cpu";
  const double square = 2.0 * 1024 * 1024 * 1024;
  d.peak_fp32 = o.peak_fp32_gflops > 0
                    ? o.peak_fp32_gflops * 1e9
                    : square / measured->gemm(1024, 1024, 1024, false, true, DType::kF32);
  d.peak_16bit = o.peak_16bit_gflops > 0
                     ? o.peak_16bit_gflops * 1e9
                     : square / measured->gemm(1024, 1024, 1024, false, true, DType::kBF16);
  d.memory_bw =
      memory_bandwidth(measured->threads, o.probe_bytes, 10 * o.budget) / measured->stretch;
  d.memory_efficiency = 1;  // measured on an elementwise pass already
  d.gemm_e_max = 1;
  d.flash_attention = true;
  const double ram =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  d.memory_bytes = ram / static_cast<double>(std::max<int64_t>(ranks, 1));
  d.runtime_bytes = runtime_bytes;
  d.fragmentation = 0;
  d.gemm_time = [measured](int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType dtype) {
    return measured->gemm(m, n, k, ta, tb, dtype);
  };
  d.attention_time = [measured](int64_t b, int64_t np, int64_t sq, int64_t skv, int64_t hn,
                                bool causal, double dropout, DType dtype, bool backward) {
    return measured->attend(b, np, sq, skv, hn, causal, dropout, dtype, backward);
  };
  d.elementwise_time = [measured](const plan::ElementwiseWork& w) {
    return measured->layer_elementwise(w);
  };
  c.nodes = 1;
  c.devices_per_node = ranks;
  c.oversubscription = std::max(1.0, o.ranks_per_core);
  // The trainer's own work per iteration outside the model: the batch (about 1 ms for the
  // benchmarks' models), the loss's and the log's reductions.
  c.iteration_overhead = 2e-3;
  if (world != nullptr && world->size() > 1) {
    c.intra =
        measure_link(*world, 10 * o.budget,
                     std::clamp<int64_t>(o.probe_bytes / 4, int64_t{1} << 18, int64_t{1} << 22));
  } else {
    c.intra = plan::Link{d.memory_bw * measured->stretch / 2, 20e-6, 1};
  }
  c.inter = c.intra;
  return c;
}

}  // namespace megatron
