// ProgressLog: Megatron's --log-progress file, SAVE/progress.txt: one tab-separated line per job
// start and per checkpoint, appended by rank 0, so that the throughput of a training run that
// spans many jobs can be read off one file:
//
//   DATE\tJob ID: ID\t# GPUs: N\tStarting job
//   DATE\tJob ID: ID\t# GPUs: N\tSaved checkpoint\tIteration: I\tJob throughput: X TFLOP/s/GPU\t
//       Cumulative throughput: Y TFLOP/s/GPU\tFloating-point operations: F\tTokens (in billions): T
//
// (the job id is $SLURM_JOB_ID, empty elsewhere; "# GPUs" counts ranks). The cumulative
// throughput counts from the first "Starting job" since the world size last changed, as
// Megatron's get_start_time_from_progress_log does.
#pragma once

#include <cstdint>
#include <string>

namespace megatron {

class ProgressLog {
 public:
  // dir: the --save directory (created if missing); world_size: ranks of this job.
  ProgressLog(std::string dir, int world_size);

  void starting_job();
  // After a checkpoint of `iteration` was saved (async: started; committed() follows): flops_*
  // are the model's FLOPs trained so far and at this job's start, job_seconds this job's training
  // time, tokens the consumed samples times the sequence length.
  void saved_checkpoint(int64_t iteration, double flops_so_far, double flops_at_start,
                        double job_seconds, double tokens, bool async);
  void committed_async(int64_t iteration);
  void deleted_checkpoint(int64_t iteration);

 private:
  void append(const std::string& text) const;
  // The first job start of this world size (seconds since the epoch) and the FLOPs saved before
  // it; false when the file holds none.
  bool cumulative_start(double* start_time, double* start_flops) const;

  std::string path_;
  int world_size_;
};

}  // namespace megatron
