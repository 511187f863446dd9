// RerunStateMachine (train/rerun_state_machine.h) on one rank, driven as the trainer drives it:
// every transition of Megatron's machine, its exit codes, the checkpoint record between two
// jobs, error injection, the spiky-value rule, determinism statistics and the tracker file's
// skip rule.
#include "train/rerun_state_machine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "core/error.h"
#include "testing/testing.h"
#include "train/exit_codes.h"

namespace megatron {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
bool is_nan(double v) {
  return std::isnan(v);
}
bool never(double) {
  return false;
}

// One rank: "any rank" is this rank's flag; messages are collected.
struct Harness {
  std::vector<std::string> first, warnings, errors;
  RerunStateMachine::Options options(RerunMode mode, const std::string& node = "node-a") {
    RerunStateMachine::Options o;
    o.mode = mode;
    o.identity = {0, node, 0};
    o.any_rank = [](bool flag) { return flag; };
    o.gather = [](const std::string& mine) { return std::vector<std::string>{mine}; };
    o.log_first = [this](const std::string& l) { first.push_back(l); };
    o.log_warning = [this](const std::string& l) { warnings.push_back(l); };
    o.log_error = [this](const std::string& l) { errors.push_back(l); };
    return o;
  }
  bool said(const std::string& part) const {
    for (const auto* v : {&first, &warnings, &errors})
      for (const std::string& l : *v)
        if (l.find(part) != std::string::npos) return true;
    return false;
  }
};

// One iteration whose n-th pass validates results[n] with `reject` under `message`; returns the
// number of passes and the decision.
struct Outcome {
  int passes = 0;
  RerunStateMachine::Decision decision;
};
Outcome iterate(RerunStateMachine& m, int64_t it, const std::vector<double>& results,
                bool (*reject)(double) = is_nan, bool fatal = true, double tolerance = 0.0) {
  Outcome o;
  while (m.should_run_forward_backward(it)) {
    const double r = results[std::min<size_t>(o.passes, results.size() - 1)];
    m.validate(1.0, never, "an earlier check", 0.0, true);  // a call before it: sequences count
    m.validate(r, reject, "loss is NaN", tolerance, fatal);
    ++o.passes;
  }
  o.decision = m.should_checkpoint_and_exit();
  return o;
}

TEST(RerunStateMachine, CleanIterationsRunOnceAndTheFirstIsNotValidated) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  // Iteration 1: no checkpoint can be taken before a step, so even a NaN passes unseen.
  Outcome o = iterate(m, 1, {kNaN});
  EXPECT_EQ(o.passes, 1);
  EXPECT_FALSE(o.decision.exit);
  o = iterate(m, 2, {1.5});
  EXPECT_EQ(o.passes, 1);
  EXPECT_FALSE(o.decision.exit);
  EXPECT_EQ(m.state(), RerunState::kNotRunningYet);
  EXPECT_FALSE(m.has_checkpoint_state());
}

TEST(RerunStateMachine, TransientFaultExits17WithACheckpointAndNoRecord) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  iterate(m, 1, {1.0});
  // NaN, then a finite re-run: not reproducible.
  const Outcome o = iterate(m, 2, {kNaN, 2.0});
  EXPECT_EQ(o.passes, 2);
  EXPECT_TRUE(o.decision.checkpoint);
  EXPECT_TRUE(o.decision.exit);
  EXPECT_EQ(o.decision.code, kExitFailedOnResultValidation);
  EXPECT_TRUE(h.said("Possible transient error"));
  EXPECT_TRUE(h.said("invokation #1 (message='loss is NaN')"));
  // Megatron's machine would record a re-run it cannot finish; here the iteration runs again.
  EXPECT_FALSE(m.has_checkpoint_state());
}

// A reproducible NaN: exit 16 with the record; the job resumed from it decides by where it runs.
struct Resumed {
  Harness h;
  RerunStateMachine m;
  Resumed(const nlohmann::json& common, const nlohmann::json& mine, const std::string& node)
      : m(h.options(RerunMode::kValidateResults, node)) {
    m.load(common, mine);
  }
};

TEST(RerunStateMachine, ReproducibleResultResumesElsewhere) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  iterate(m, 1, {1.0});
  const Outcome o = iterate(m, 2, {kNaN, kNaN});
  EXPECT_EQ(o.passes, 2);
  EXPECT_TRUE(o.decision.checkpoint);
  EXPECT_EQ(o.decision.code, kExitResumeToDisambiguate);
  ASSERT_TRUE(m.has_checkpoint_state());
  // Through text, as a checkpoint stores it (the NaN result included).
  const nlohmann::json common = nlohmann::json::parse(m.common_state().dump());
  const nlohmann::json mine = nlohmann::json::parse(m.rank_state().dump());
  EXPECT_EQ(mine["initial_result"], "nan");
  EXPECT_EQ(mine["suspicious_node"], "node-a");

  {  // the same node and device: exit 16 again, no new checkpoint
    Resumed r(common, mine, "node-a");
    EXPECT_TRUE(r.h.said("Will rerun step"));
    const Outcome again = iterate(r.m, 2, {kNaN});
    EXPECT_EQ(again.passes, 1);
    EXPECT_FALSE(again.decision.checkpoint);
    EXPECT_EQ(again.decision.code, kExitResumeToDisambiguate);
    EXPECT_TRUE(r.h.said("Got rescheduled on the same GPU"));
  }
  {  // elsewhere, a different result: the first device was faulty
    Resumed r(common, mine, "node-b");
    const Outcome o2 = iterate(r.m, 2, {2.0});
    EXPECT_FALSE(o2.decision.checkpoint);
    EXPECT_EQ(o2.decision.code, kExitFailedOnResultValidation);
    EXPECT_TRUE(r.h.said("Possible persistent error"));
  }
  {  // elsewhere, the same NaN: a correct result, fatal
    Resumed r(common, mine, "node-b");
    const Outcome o2 = iterate(r.m, 2, {kNaN});
    EXPECT_EQ(o2.decision.code, kExitFailedOnResultValidation);
    EXPECT_TRUE(r.h.said("Correct result (but possible Application error) (loss is NaN)"));
  }
}

TEST(RerunStateMachine, ReproducedNonFatalResultContinues) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  iterate(m, 1, {1.0});
  auto big = [](double v) { return v > 100; };
  Outcome o;
  while (m.should_run_forward_backward(2)) {
    m.validate(500, big, "Spiky loss", 0.0, /*fatal=*/false);
    ++o.passes;
  }
  o.decision = m.should_checkpoint_and_exit();
  EXPECT_EQ(o.decision.code, kExitResumeToDisambiguate);
  Resumed r(m.common_state(), m.rank_state(), "node-b");
  int passes = 0;
  while (r.m.should_run_forward_backward(2)) {
    r.m.validate(500, big, "Spiky loss", 0.0, false);
    ++passes;
  }
  EXPECT_EQ(passes, 1);
  EXPECT_FALSE(r.m.should_checkpoint_and_exit().exit);
  EXPECT_TRUE(r.h.said("Continuing normal execution"));
  // Normal iterations afterwards, validated again.
  EXPECT_EQ(iterate(r.m, 3, {1.0}).passes, 1);
  EXPECT_EQ(iterate(r.m, 4, {kNaN, 1.0}).decision.code, kExitFailedOnResultValidation);
}

TEST(RerunStateMachine, AnotherRanksRerunAfterAContinueComparesNothingHere) {
  // This rank's spike was diagnosed correct and training continued; later another rank rejects
  // a result. In that re-run this rank's validations must not be compared with its old spike.
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  iterate(m, 1, {1.0});
  auto big = [](double v) { return v > 100; };
  while (m.should_run_forward_backward(2)) m.validate(500, big, "Spiky loss", 0.0, false);
  Harness h2;
  bool others = false;  // whether another rank raises a flag
  RerunStateMachine::Options o = h2.options(RerunMode::kValidateResults, "node-b");
  o.any_rank = [&](bool flag) { return flag || others; };
  (void)m.should_checkpoint_and_exit();
  RerunStateMachine r(o);
  r.load(m.common_state(), m.rank_state());
  while (r.should_run_forward_backward(2)) r.validate(500, big, "Spiky loss", 0.0, false);
  EXPECT_FALSE(r.should_checkpoint_and_exit().exit);  // continued
  h2.warnings.clear();
  h2.errors.clear();
  others = true;  // iteration 3: another rank's result is rejected, not reproducible there
  int passes = 0;
  while (r.should_run_forward_backward(3)) {
    r.validate(600, never, "Spiky loss", 0.0, false);  // sequence 1, as the old failed call
    ++passes;
    if (passes == 2) others = false;  // no rank asks for a checkpoint: transient
  }
  EXPECT_EQ(passes, 2);
  EXPECT_EQ(r.should_checkpoint_and_exit().code, kExitFailedOnResultValidation);
  EXPECT_TRUE(h2.warnings.empty()) << h2.warnings.front();
  EXPECT_TRUE(h2.errors.empty()) << h2.errors.front();
}

TEST(RerunStateMachine, ToleranceDecidesReproducibility) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  iterate(m, 1, {1.0});
  auto any = [](double) { return true; };
  // 1000 vs 1000.5: relative difference 5e-4, within Megatron's 0.1% gradient tolerance.
  Outcome o;
  const double results[] = {1000.0, 1000.5};
  while (m.should_run_forward_backward(2)) m.validate(results[o.passes++], any, "g", 1e-3, true);
  EXPECT_EQ(m.should_checkpoint_and_exit().code, kExitResumeToDisambiguate);
  Harness h2;
  RerunStateMachine m2(h2.options(RerunMode::kValidateResults));
  iterate(m2, 1, {1.0});
  int pass = 0;
  while (m2.should_run_forward_backward(2)) m2.validate(results[pass++], any, "g", 1e-4, true);
  EXPECT_EQ(m2.should_checkpoint_and_exit().code, kExitFailedOnResultValidation);
}

TEST(RerunStateMachine, DisabledModeThrowsNamingRankNodeAndIteration) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kDisabled));
  EXPECT_EQ(iterate(m, 1, {1.0}).passes, 1);
  try {
    iterate(m, 2, {kNaN});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Rank 0, node node-a, device 0, iteration 2: Unexpected result nan "
                        "(message='loss is NaN')"),
              std::string::npos)
        << what;
  }
}

TEST(RerunStateMachine, InjectedErrorsFollowTheirType) {
  for (RerunDiagnostic d : {RerunDiagnostic::kTransientError, RerunDiagnostic::kPersistentError,
                            RerunDiagnostic::kCorrectResult}) {
    Harness h;
    RerunStateMachine::Options o = h.options(RerunMode::kValidateResults);
    o.error_injection_rate = 1;  // every validation
    o.error_injection_type = d;
    RerunStateMachine m(o);
    iterate(m, 1, {1.0});
    // Finite results throughout: only the injection rejects.
    const Outcome first = iterate(m, 2, {1.0}, never);
    if (d == RerunDiagnostic::kTransientError) {
      EXPECT_EQ(first.decision.code, kExitFailedOnResultValidation);
      continue;
    }
    EXPECT_EQ(first.decision.code, kExitResumeToDisambiguate);
    EXPECT_EQ(m.rank_state()["injected_error_type"],
              d == RerunDiagnostic::kPersistentError ? "persistent_error" : "correct_result");
    Harness h2;
    RerunStateMachine::Options o2 = h2.options(RerunMode::kValidateResults, "node-b");
    RerunStateMachine r(o2);
    r.load(m.common_state(), m.rank_state());
    const Outcome second = iterate(r, 2, {1.0}, never);
    EXPECT_EQ(second.decision.code, kExitFailedOnResultValidation);  // the call is fatal
    EXPECT_TRUE(h2.said(d == RerunDiagnostic::kPersistentError ? "Possible persistent error"
                                                               : "Correct result"));
  }
}

TEST(RerunStateMachine, InjectionRateIsAboutOneInN) {
  Harness h;
  RerunStateMachine::Options o = h.options(RerunMode::kValidateResults);
  o.error_injection_rate = 8;
  RerunStateMachine m(o);
  iterate(m, 1, {1.0});
  // Each iteration's first validation draws until one injects: over many iterations about 1 in
  // 8 of the draws (two per iteration here). Bounds: 3 standard deviations of a binomial.
  int injected = 0;
  const int iterations = 2000;
  for (int it = 2; it < 2 + iterations; ++it) {
    const Outcome out = iterate(m, it, {1.0}, never);
    if (out.passes > 1) ++injected;
    if (out.decision.exit) {  // transient: start afresh, as a resumed job would
      m = RerunStateMachine(o);
      iterate(m, it, {1.0});
    }
  }
  const double p = 1 - (7.0 / 8) * (7.0 / 8), mean = p * iterations,
               sd = std::sqrt(iterations * p * (1 - p));
  EXPECT_NEAR(injected, mean, 3 * sd);
}

TEST(RerunStateMachine, UnexpectedlyLargeValues) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  // The first 100 finite values set the maximum (NaN and Inf are ignored), then 10x rejects.
  EXPECT_FALSE(m.is_unexpectedly_large(kNaN, 10, "loss"));
  for (int i = 0; i < 100; ++i)
    EXPECT_FALSE(m.is_unexpectedly_large(i == 50 ? -4.0 : 2.0, 10, "loss"));
  EXPECT_TRUE(h.said("Max value for loss: 4"));
  EXPECT_FALSE(m.is_unexpectedly_large(39.9, 10, "loss"));
  EXPECT_TRUE(m.is_unexpectedly_large(40.0, 10, "loss"));
  EXPECT_TRUE(m.is_unexpectedly_large(-40.0, 10, "loss"));
  EXPECT_FALSE(m.is_unexpectedly_large(40.0, 10, "grads"));  // its own history
}

TEST(RerunStateMachine, ReportStatsRerunsEveryIterationAndDescribesDifferences) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kReportStats));
  // Iteration 1 identical; iteration 2 differs by 2 (1 vs 3: |1-3| / 2 = 1).
  int passes = 0;
  while (m.should_run_forward_backward(1)) {
    m.validate(1.0, never, "loss", 0, true);
    ++passes;
  }
  EXPECT_EQ(passes, 2);
  EXPECT_FALSE(m.should_checkpoint_and_exit().exit);
  passes = 0;
  while (m.should_run_forward_backward(2)) {
    m.validate(passes == 0 ? 1.0 : 3.0, never, "loss", 0, true);
    ++passes;
  }
  EXPECT_EQ(passes, 2);
  // Reported at even iterations: t = 2 samples, 1 identical; avg = 1 / 2; p50 = samples[1 - 1].
  EXPECT_TRUE(
      h.said("  loss: 2/1 total/identical samples, rel. variability: avg= 5.000E-01, "
             "p50= 1.000E+00, p90= 1.000E+00, p99= 1.000E+00, p99.9= 1.000E+00, max: "
             "1.000E+00"))
      << (h.first.empty() ? "" : h.first.back());
}

TEST(RerunStateMachine, SkippedIterationDropsThePendingRerun) {
  Harness h;
  RerunStateMachine m(h.options(RerunMode::kValidateResults));
  iterate(m, 1, {1.0});
  iterate(m, 2, {kNaN, kNaN});
  Resumed r(m.common_state(), m.rank_state(), "node-a");
  r.m.skip_iteration(2);
  EXPECT_EQ(r.m.state(), RerunState::kNotRunningYet);
  EXPECT_EQ(iterate(r.m, 3, {1.0}).passes, 1);
}

TEST(RerunStateMachine, BadFlagValuesNameTheFlag) {
  EXPECT_THROW(parse_rerun_mode("report_determinism_stats"), InvalidArgument);
  EXPECT_EQ(parse_rerun_mode("report_stats"), RerunMode::kReportStats);
  try {
    parse_rerun_diagnostic("flaky");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--error-injection-type"), std::string::npos);
  }
  Harness h;
  RerunStateMachine::Options o = h.options(RerunMode::kValidateResults);
  o.tracker_file = "/nonexistent-dir/tracker.txt";
  try {
    RerunStateMachine m(o);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--result-rejected-tracker-filename"), std::string::npos);
  }
}

TEST(RerunStateMachine, TrackerFileSkipRule) {
  const std::string path = testing::scratch_dir("rerun_tracker_rule") + "/tracker.txt";
  {
    std::ofstream f(path);
    auto line = [&](const char* job, int rank, int it, const char* status) {
      f << "ts=2026-12-06 10:00:00.000000 node=n device=0 jobID=" << job << " rank=" << rank
        << " iteration=" << it << " status=" << status << " result=nan message='loss is NaN'\n";
    };
    line("7", 0, 5, "initial_run");                // not a counted status
    line("7", 0, 5, "first_rerun_reproducible");   // rank 0, iteration 5: once
    line("8", 0, 5, "second_rerun_reproducible");  // twice on rank 0: skipped
    line("7", 1, 9, "rerun_disabled");
    line("7", 1, 9, "RerunValidationStatus.RERUN_DISABLED");  // Python 3.12's spelling
    line("7", 0, 12, "first_rerun_reproducible");
    line("7", 0, 12, "first_rerun_reproducible");
    line("7", 1, 12, "first_rerun_reproducible");  // two ranks of job 7: not skipped
    line("7", 2, 14, "first_rerun_not_reproducible");
    f << "garbage line\n";
  }
  std::vector<int64_t> several;
  EXPECT_EQ(skipped_iterations_from_tracker(path, &several), (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(several, (std::vector<int64_t>{12}));
  std::filesystem::remove(path);
  EXPECT_TRUE(skipped_iterations_from_tracker(path).empty());
}

TEST(RerunStateMachine, RejectionsAreAppendedToTheTracker) {
  const std::string path = testing::scratch_dir("rerun_tracker_log") + "/tracker.txt";
  Harness h;
  RerunStateMachine::Options o = h.options(RerunMode::kValidateResults);
  o.tracker_file = path;
  RerunStateMachine m(o);
  iterate(m, 1, {1.0});
  iterate(m, 2, {kNaN, kNaN});
  std::ifstream in(path);
  std::string a, b, extra;
  ASSERT_TRUE(std::getline(in, a) && std::getline(in, b));
  EXPECT_FALSE(std::getline(in, extra));
  EXPECT_NE(a.find("node=node-a device=0 jobID="), std::string::npos) << a;
  EXPECT_NE(a.find("rank=0 iteration=2 status=initial_run result=nan message='loss is NaN'"),
            std::string::npos)
      << a;
  EXPECT_NE(b.find("status=first_rerun_reproducible"), std::string::npos) << b;
  // The lines read back by the skip rule: twice on rank 0 (initial_run does not count): once.
  EXPECT_TRUE(skipped_iterations_from_tracker(path).empty());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace megatron
