// Megatron's progress.txt lines and its cumulative-throughput reading of the file.
#include "train/progress_log.h"

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/logging.h"

namespace megatron {

namespace {

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream in(line);
  for (std::string part; std::getline(in, part, '\t');) out.push_back(part);
  return out;
}

// "Name: value" -> value.
std::string field(const std::string& s) {
  const size_t at = s.find(": ");
  return at == std::string::npos ? std::string() : s.substr(at + 2);
}

// The local time of timestamp()'s "YYYY-MM-DD HH:MM:SS" as seconds since the epoch.
double parse_time(const std::string& s) {
  std::tm tm{};
  std::istringstream in(s);
  in >> std::get_time(&tm, "%Y-%m-%d %H:%M:%S");
  if (in.fail()) return -1;
  tm.tm_isdst = -1;
  return static_cast<double>(std::mktime(&tm));
}

}  // namespace

ProgressLog::ProgressLog(std::string dir, int world_size)
    : path_(std::move(dir) + "/progress.txt"), world_size_(world_size) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  MEGATRON_CHECK(!ec, "--log-progress: cannot create the --save directory for ", path_, " (",
                 ec.message(), ")");
}

void ProgressLog::append(const std::string& text) const {
  const char* job = std::getenv("SLURM_JOB_ID");
  std::ofstream out(path_, std::ios::app);
  MEGATRON_CHECK(out.good(), "--log-progress: cannot append to ", path_);
  out << timestamp() << "\tJob ID: " << (job ? job : "") << "\t# GPUs: " << world_size_ << "\t"
      << text << "\n";
}

void ProgressLog::starting_job() {
  append("Starting job");
}

bool ProgressLog::cumulative_start(double* start_time, double* start_flops) const {
  std::ifstream in(path_);
  double latest_flops = 0;
  bool found = false;
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> t = split_tabs(line);
    if (t.size() < 4) continue;
    const int world = std::atoi(field(t[2]).c_str());
    if (t[3] == "Saved checkpoint" && t.size() > 7) {
      latest_flops = std::strtod(field(t[7]).c_str(), nullptr);
    }
    if (world != world_size_) {  // a different world size restarts the count
      found = false;
      continue;
    }
    if (t[3] == "Starting job" && !found) {
      *start_time = parse_time(t[0]);
      *start_flops = latest_flops;
      found = *start_time >= 0;
    }
  }
  return found;
}

void ProgressLog::saved_checkpoint(int64_t iteration, double flops_so_far, double flops_at_start,
                                   double job_seconds, double tokens, bool async) {
  const double per_rank = 1e12 * world_size_;
  const double job = (flops_so_far - flops_at_start) / (std::max(job_seconds, 1e-9) * per_rank);
  double start_time = 0, start_flops = 0, cumulative = job;
  if (cumulative_start(&start_time, &start_flops)) {
    const double elapsed = std::max(static_cast<double>(std::time(nullptr)) - start_time, 1.0);
    cumulative = (flops_so_far - start_flops) / (elapsed * per_rank);
  }
  append(
      strprintf("%s\tIteration: %ld\tJob throughput: %.1f TFLOP/s/GPU\tCumulative "
                "throughput: %.1f TFLOP/s/GPU\tFloating-point operations: %.2e\tTokens (in "
                "billions): %.2f",
                async ? "Saving async checkpoint" : "Saved checkpoint",
                static_cast<long>(iteration), job, cumulative, flops_so_far, tokens / 1e9));
}

void ProgressLog::committed_async(int64_t iteration) {
  append(strprintf("Saved async checkpoint\tIteration: %ld", static_cast<long>(iteration)));
}

void ProgressLog::deleted_checkpoint(int64_t iteration) {
  append(strprintf("Deleted checkpoint\tIteration: %ld", static_cast<long>(iteration)));
}

}  // namespace megatron
