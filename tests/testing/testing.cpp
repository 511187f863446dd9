// Shared test helpers: tolerance comparison with a worst-index report, deterministic random
// tensors and ids, scratch directories.
#include "testing/testing.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>

#include "core/philox.h"

namespace megatron::testing {

double nmse(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.item(i), w = want.item(i);
    num += (g - w) * (g - w);
    den += w * w;
  }
  return num / den;
}

CloseReport compare(const Tensor& got, const Tensor& want, double atol, double rtol) {
  CloseReport r;
  if (got.numel() != want.numel()) {
    r.ok = false;
    r.message = "size mismatch: got " + got.str() + ", want " + want.str();
    return r;
  }
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.item(i), w = want.item(i);
    double err = std::fabs(g - w);
    bool bad = !(err <= atol + rtol * std::fabs(w)) || std::isnan(g) != std::isnan(w);
    double rel = err / std::max(std::fabs(w), 1e-30);
    if (err > r.max_abs || bad) {
      if (bad && r.ok) r.worst = i;
      if (err > r.max_abs) r.max_abs = err;
    }
    r.max_rel = std::max(r.max_rel, std::min(rel, 1e30));
    if (bad) r.ok = false;
  }
  if (!r.ok) {
    std::ostringstream os;
    os << "not close (atol " << atol << ", rtol " << rtol << "): max abs err " << r.max_abs
       << ", max rel err " << r.max_rel << "; first failing index " << r.worst << ": got "
       << got.item(r.worst) << ", want " << want.item(r.worst) << " (" << got.str() << ")";
    r.message = os.str();
  }
  return r;
}

::testing::AssertionResult allclose(const Tensor& got, const Tensor& want, double atol,
                                    double rtol) {
  CloseReport r = compare(got, want, atol, rtol);
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.message;
}

Tensor random_tensor(const Shape& shape, uint64_t seed, double scale, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::kF64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    double u = Philox::uniform(seed, 0x7e57, static_cast<uint64_t>(i));
    // Round through f32 so f32 and f64 copies of a "random" tensor hold identical values.
    p[i] = static_cast<float>((2.0 * u - 1.0) * scale);
  }
  return dtype == DType::kF64 ? t : t.to(dtype);
}

Tensor fd_grad(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const Tensor& dout) {
  const double h = 1e-6;
  Tensor g = Tensor::zeros(x.shape(), DType::kF64);
  Tensor xp = x.clone();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double orig = xp.data<double>()[i];
    auto loss = [&](double v) {
      xp.data<double>()[i] = v;
      Tensor y = f(xp);
      double s = 0;
      for (int64_t j = 0; j < y.numel(); ++j) s += y.data<double>()[j] * dout.data<double>()[j];
      return s;
    };
    g.data<double>()[i] = (loss(orig + h) - loss(orig - h)) / (2 * h);
    xp.data<double>()[i] = orig;
  }
  return g;
}

Tensor random_ids(const Shape& shape, uint64_t seed, int64_t vocab) {
  Tensor t = Tensor::empty(shape, DType::kI64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    auto b = Philox::block(seed, static_cast<uint64_t>(i), 0x1d5);
    p[i] = static_cast<int64_t>(b[0] % static_cast<uint32_t>(vocab));
  }
  return t;
}

std::string scratch_dir(const std::string& name) {
  namespace fs = std::filesystem;
  // ctest runs each test case as its own process, two at a time: a name shared by a helper used
  // in several cases (the same files written with different contents) would let one case read
  // or delete another's files. The running case's name makes the folder its own.
  std::string dir = "megatron_test_" + name;
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    dir += std::string("_") + info->test_suite_name() + "." + info->name();
    for (char& c : dir)
      if (c == '/') c = '_';
  }
  fs::path p = fs::temp_directory_path() / dir;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace megatron::testing
