// `megatron bench gemm`: the measured GEMM peak (oneDNN, f32 and bf16) that model-FLOPs
// utilisation is reported against.
#include "cli/arg_table.h"
#include "cli/commands.h"
#include "core/logging.h"
#include "core/threads.h"
#include "train/gemm_peak.h"

namespace megatron::cli {

int bench_command(int argc, char** argv) {
  CLI::App app("Measure peaks of this machine", "bench");
  std::string what;
  std::vector<int64_t> sizes{512, 1024, 2048};
  double seconds = 1.0;
  int64_t threads = 0;
  app.add_option("what", what, "gemm")->required()->check(CLI::IsMember({"gemm"}));
  app.add_option("--sizes", sizes, "Square GEMM sizes")->capture_default_str();
  app.add_option("--seconds", seconds, "Seconds per measurement")->capture_default_str();
  app.add_option("--num-threads", threads, "OpenMP threads (default: available cores)");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  set_num_threads(static_cast<int>(threads));
  for (DType t : {DType::kF32, DType::kBF16}) {
    double best = 0;
    for (int64_t n : sizes) {
      double g = measure_gemm_gflops(t, n, seconds);
      best = std::max(best, g);
      log_line(strprintf("gemm %-4s n=%-5ld threads=%d: %8.1f GFLOP/s", dtype_name(t),
                         static_cast<long>(n), num_threads(), g));
    }
    log_line(strprintf("gemm %-4s peak: %.1f GFLOP/s", dtype_name(t), best));
  }
  return 0;
}

}  // namespace megatron::cli
