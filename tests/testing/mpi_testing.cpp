// See mpi_testing.h.
#include "testing/mpi_testing.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tensor/tensor.h"

namespace megatron::testing {
namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

}  // namespace

int expected_world_size(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--world-size=", 13) == 0) return std::atoi(argv[i] + 13);
  }
  return 0;
}

int run_all_tests_on_every_rank(MpiRuntime& runtime, int expected_world) {
  if (expected_world != runtime.world_size()) {
    std::fprintf(stderr, "rank %d: expected a world of %d processes (--world-size), got %d\n",
                 runtime.rank(), expected_world, runtime.world_size());
    return 1;
  }
  if (runtime.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(runtime.rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  Tensor flag = Tensor::full({1}, failed, DType::kI32);
  runtime.world()->all_reduce(flag, ReduceOp::kMax);
  const int any_failed = flag.data<int32_t>()[0];
  if (any_failed && !failed) {
    std::fprintf(stderr, "rank %d: a test failed on another rank\n", runtime.rank());
  }
  return any_failed;
}

}  // namespace megatron::testing
