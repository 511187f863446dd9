// GEMM through oneDNN (f32, and bf16 inputs with f32 accumulation), plus a plain f64 loop for the
// finite-difference tests.
//
// Transposes and leading dimensions are expressed as memory strides, so no copy is made. oneDNN
// primitives are created once per (shape, strides, dtype, accumulate, planned threads) and cached:
// creating one costs far more than running a small GEMM. The cache is per calling thread (the
// trainer calls from one thread; grouped_matmul's workers have their own), so it needs no lock.
//
// oneDNN has bf16 matmul kernels only on CPUs with AVX-512 (bf16 instructions or their emulation),
// f16 ones only with AVX-512 FP16 or AMX; elsewhere it cannot create the primitive. Then a bf16 or
// f16 GEMM widens its inputs to f32 (exact: every 16-bit float value is an f32 value) and runs the
// f32 kernel, which computes the same thing, 16-bit inputs with f32 accumulation, at f32 speed.
// native_half_gemm() tells callers which one they get.
#include <unistd.h>

#include <omp.h>

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <dnnl.hpp>

#include "core/logging.h"
#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gemm.h"
#include "tensor/ops.h"

namespace megatron::cpu {
namespace {

struct GemmKey {
  GemmShape s;
  int threads;  // what the primitive was planned for
  auto tie() const {
    return std::tie(s.m, s.n, s.k, s.ta, s.tb, s.lda, s.ldb, s.ldc, s.dtype, s.accumulate, threads);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

// Elements from the first to the last one a strided [rows, cols] view reads.
int64_t span(int64_t rows, int64_t cols, int64_t ld) {
  return (rows - 1) * ld + cols;
}

class GemmCache {
 public:
  static GemmCache& instance() {
    static thread_local GemmCache cache;
    return cache;
  }

  void run(const GemmKey& key, const void* a, const void* b, void* c) {
    auto it = prims_.find(key);
    if (it == prims_.end()) it = prims_.emplace(key, create(key)).first;
    const Entry& e = it->second;
    if (e.widen) {
      const GemmShape& s = key.s;
      half_ = s.dtype;
      a = widen(a, s.ta ? span(s.k, s.m, s.lda) : span(s.m, s.k, s.lda), &wide_a_);
      b = widen(b, s.tb ? span(s.n, s.k, s.ldb) : span(s.k, s.n, s.ldb), &wide_b_);
    }
    dnnl::memory ma(e.a_md, engine_, const_cast<void*>(a));
    dnnl::memory mb(e.b_md, engine_, const_cast<void*>(b));
    dnnl::memory mc(e.c_md, engine_, c);
    e.prim.execute(stream_, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream_.wait();
  }

 private:
  struct Entry {
    dnnl::memory::desc a_md, b_md, c_md;
    dnnl::matmul prim;
    bool widen = false;  // bf16 inputs run through the f32 primitive
  };

  const void* widen(const void* src, int64_t n, std::vector<float>* buf) {
    if (static_cast<int64_t>(buf->size()) < n) buf->resize(static_cast<size_t>(n));
    convert(buf->data(), DType::kF32, src, half_, n);
    return buf->data();
  }

  GemmCache() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  Entry create(const GemmKey& key) {
    if (is_half(key.s.dtype)) {
      try {
        return create_with(key, key.s.dtype == DType::kBF16 ? dnnl::memory::data_type::bf16
                                                            : dnnl::memory::data_type::f16);
      } catch (const dnnl::error&) {
        Entry e = create_with(key, dnnl::memory::data_type::f32);
        e.widen = true;
        return e;
      }
    }
    return create_with(key, dnnl::memory::data_type::f32);
  }

  Entry create_with(const GemmKey& key, dnnl::memory::data_type in) {
    using dt = dnnl::memory::data_type;
    const GemmShape& s = key.s;
    // Logical A is [m, k]; stored row-major as [m, k] or, when transposed, as [k, m].
    dnnl::memory::dims a_strides =
        s.ta ? dnnl::memory::dims{1, s.lda} : dnnl::memory::dims{s.lda, 1};
    dnnl::memory::dims b_strides =
        s.tb ? dnnl::memory::dims{1, s.ldb} : dnnl::memory::dims{s.ldb, 1};
    Entry e;
    e.a_md = dnnl::memory::desc({s.m, s.k}, in, a_strides);
    e.b_md = dnnl::memory::desc({s.k, s.n}, in, b_strides);
    e.c_md = dnnl::memory::desc({s.m, s.n}, dt::f32, dnnl::memory::dims{s.ldc, 1});
    dnnl::primitive_attr attr;
    if (s.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::desc desc(e.a_md, e.b_md, e.c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, engine_);
    e.prim = dnnl::matmul(pd);
    return e;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<GemmKey, Entry> prims_;
  std::vector<float> wide_a_, wide_b_;
  DType half_ = DType::kBF16;  // the dtype being widened
};

// C[m, n] (+)= op(A) op(B) in double: the reference path for f64 tensors.
void gemm_f64(double* c, const double* a, bool ta, const double* b, bool tb, int64_t m, int64_t n,
              int64_t k, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      c[i * n + j] = accumulate ? c[i * n + j] + s : s;
    }
  }
}

}  // namespace

void gemm(const GemmShape& s, const void* a, const void* b, float* c) {
  GemmCache::instance().run(GemmKey{s, omp_get_max_threads()}, a, b, c);
}

void matmul(Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float beta) {
  MEGATRON_CHECK(a.ndim() >= 2 && b.ndim() >= 2, "matmul: inputs must have >= 2 dims, got ",
                 a.str(), " and ", b.str());
  MEGATRON_CHECK(beta == 0.0f || beta == 1.0f, "matmul: beta must be 0 or 1, got ", beta);
  // 2-D views: leading dims flattened.
  const int64_t a_rows = a.numel() / a.dim(-1), a_cols = a.dim(-1);
  const int64_t b_rows = b.numel() / b.dim(-1), b_cols = b.dim(-1);
  const int64_t m = trans_a ? a_cols : a_rows, k = trans_a ? a_rows : a_cols;
  const int64_t kb = trans_b ? b_cols : b_rows, n = trans_b ? b_rows : b_cols;
  MEGATRON_CHECK(k == kb, "matmul: inner dims differ: op(a) is [", m, ", ", k, "], op(b) is [", kb,
                 ", ", n, "] (a ", a.str(), trans_a ? "^T" : "", ", b ", b.str(),
                 trans_b ? "^T" : "", ")");
  MEGATRON_CHECK(out.numel() == m * n && out.dim(-1) == n, "matmul: out ", out.str(), " is not [",
                 m, ", ", n, "]");
  cpu::check_same_dtype(a, b, "matmul");
  if (m == 0 || n == 0) return;
  if (a.dtype() == DType::kF64) {
    MEGATRON_CHECK(out.dtype() == DType::kF64, "matmul: f64 inputs need an f64 output");
    gemm_f64(out.data<double>(), a.data<double>(), trans_a, b.data<double>(), trans_b, m, n, k,
             beta != 0.0f);
    return;
  }
  MEGATRON_CHECK(a.dtype() == DType::kF32 || is_half(a.dtype()),
                 "matmul: inputs must be f32, bf16, f16 or f64, got ", dtype_name(a.dtype()));
  MEGATRON_CHECK(out.dtype() == DType::kF32, "matmul: output must be f32, got ",
                 dtype_name(out.dtype()));
  if (k == 0) {
    if (beta == 0.0f) out.zero();
    return;
  }
  const GemmShape shape{
      m, n, k, trans_a, trans_b, trans_a ? m : k, trans_b ? k : n, n, a.dtype(), beta != 0.0f};
  if (!skinny_gemm(shape, a.raw(), b.raw(), out.data<float>()))
    gemm(shape, a.raw(), b.raw(), out.data<float>());
}

}  // namespace megatron::cpu

namespace megatron::ops {
namespace {
// Whether oneDNN builds a 16-bit GEMM on this CPU (ops::native_half_gemm below).
bool can_create_half_gemm(dnnl::memory::data_type half) {
  try {
    using dt = dnnl::memory::data_type;
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::memory::desc a({8, 8}, half, dnnl::memory::dims{8, 1});
    dnnl::memory::desc c({8, 8}, dt::f32, dnnl::memory::dims{8, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}
}  // namespace

bool native_half_gemm(DType t) {
  static const bool bf16 = can_create_half_gemm(dnnl::memory::data_type::bf16);
  static const bool f16 = can_create_half_gemm(dnnl::memory::data_type::f16);
  MEGATRON_CHECK(is_half(t), "native_half_gemm: ", dtype_name(t), " is not a 16-bit float");
  return t == DType::kBF16 ? bf16 : f16;
}

std::string numerics_fingerprint() {
  // The extensions that change results: vector width (reduction order) and 16-bit kernels.
  std::string isa = "x86-64";
#if defined(__AVX2__)
  isa += "+avx2";
#endif
#if defined(__FMA__)
  isa += "+fma";
#endif
#if defined(__AVX512F__)
  isa += "+avx512f";
#endif
#if defined(__AVX512BF16__)
  isa += "+avx512bf16";
#endif
#if defined(__AMX_TILE__)
  isa += "+amx";
#endif
  const dnnl_version_t* v = dnnl_version();
  const char* kernels = "unknown";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      kernels = "sse41";
      break;
    case dnnl::cpu_isa::avx:
      kernels = "avx";
      break;
    case dnnl::cpu_isa::avx2:
      kernels = "avx2";
      break;
    case dnnl::cpu_isa::avx2_vnni:
      kernels = "avx2_vnni";
      break;
    case dnnl::cpu_isa::avx512_core:
      kernels = "avx512_core";
      break;
    case dnnl::cpu_isa::avx512_core_vnni:
      kernels = "avx512_core_vnni";
      break;
    case dnnl::cpu_isa::avx512_core_bf16:
      kernels = "avx512_core_bf16";
      break;
    case dnnl::cpu_isa::avx512_core_amx:
      kernels = "avx512_core_amx";
      break;
    default:
      break;
  }
#if defined(__clang__)
  const char* compiler = "clang";
#else
  const char* compiler = "gcc";
#endif
  // oneDNN sizes its GEMM blocks (and so the order of its sums) by the caches.
  return strprintf(
      "compiled for %s with %s %s; oneDNN %d.%d.%d kernels %s; L1d %ld KiB, L2 %ld KiB",
      isa.c_str(), compiler, __VERSION__, v->major, v->minor, v->patch, kernels,
      sysconf(_SC_LEVEL1_DCACHE_SIZE) / 1024, sysconf(_SC_LEVEL2_CACHE_SIZE) / 1024);
}

}  // namespace megatron::ops
