// `megatron bench gemm`: the measured GEMM peak (oneDNN, f32 and bf16) that model-FLOPs
// utilisation is reported against, for square sizes or for given shapes (a model step's GEMMs,
// see bench/gemm_shapes.py).
#include "cli/arg_table.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/threads.h"
#include "train/gemm_peak.h"

namespace megatron::cli {

int bench_command(int argc, char** argv) {
  CLI::App app("Measure peaks of this machine", "bench");
  std::string what;
  std::vector<int64_t> sizes{512, 1024, 2048};
  std::vector<std::string> shape_texts;
  std::vector<std::string> dtypes{"f32", "bf16"};
  double seconds = 1.0;
  int64_t threads = 0;
  app.add_option("what", what, "gemm")->required()->check(CLI::IsMember({"gemm"}));
  CLI::Option* sizes_opt =
      app.add_option("--sizes", sizes, "Square GEMM sizes")->capture_default_str();
  const CLI::Validator shape_check(
      [](std::string& text) {
        try {
          parse_gemm_shape(text);
          return std::string();
        } catch (const InvalidArgument& e) {
          return std::string(e.what());
        }
      },
      "MxNxK[:XY]");
  app.add_option("--shapes", shape_texts,
                 "GEMM shapes instead of squares: MxNxK or MxNxK:XY, X and Y each N or T "
                 "(A, B transposed); default NT")
      ->check(shape_check)
      ->excludes(sizes_opt);
  app.add_option("--dtypes", dtypes, "Input dtypes")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--seconds", seconds, "Seconds per measurement")->capture_default_str();
  app.add_option("--num-threads", threads, "OpenMP threads (default: available cores)");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  set_num_threads(static_cast<int>(threads));
  std::vector<GemmShape> shapes;
  for (const std::string& t : shape_texts) shapes.push_back(parse_gemm_shape(t));
  if (shapes.empty()) {
    for (int64_t n : sizes) shapes.push_back(GemmShape{n, n, n, false, true});
  }
  for (const std::string& name : dtypes) {
    const DType t = name == "bf16" ? DType::kBF16 : DType::kF32;
    double best = 0;
    for (const GemmShape& s : shapes) {
      const double g = measure_gemm_gflops(t, s, seconds);
      best = std::max(best, g);
      const std::string label =
          shape_texts.empty() ? "n=" + std::to_string(s.m) : gemm_shape_name(s);
      log_line(strprintf("gemm %-4s %-5s threads=%d: %8.1f GFLOP/s", dtype_name(t), label.c_str(),
                         num_threads(), g));
    }
    log_line(strprintf("gemm %-4s peak: %.1f GFLOP/s", dtype_name(t), best));
  }
  return 0;
}

}  // namespace megatron::cli
