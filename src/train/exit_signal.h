// ExitSignalHandler: Megatron's --exit-signal-handler, "save a checkpoint and stop when the
// scheduler says time is up".
//
// Cluster schedulers (SLURM, Kubernetes) send a signal, SIGTERM by default (--exit-signal), some
// seconds before they kill a job. With the handler installed, the first delivery only sets a flag;
// the trainer polls received() between iterations, agrees across ranks that one of them got it,
// saves, and returns normally. A second delivery while that is under way means the sender will not
// wait for the save: the handler then writes a fixed line to stderr, restores the default action
// and re-raises the signal, so the process dies of it (its exit status still says which signal).
//
// The first delivery also makes stdout and stderr non-blocking: a launcher that stops reading the
// ranks' output once it has decided to end the job (Open MPI's mpirun does on SIGTERM) would
// otherwise leave a rank blocked in a log line, never reaching the save; a line may be dropped,
// the checkpoint is not.
//
// It is not a general signal framework: one signal, one instance per process (a signal handler has
// no context pointer, so its state is necessarily process-wide), nothing but a flag and the
// output flags in the handler (only async-signal-safe calls are allowed there). The cross-rank
// agreement and the save are the trainer's.
#pragma once

#include <csignal>
#include <string>

namespace megatron {

// The --exit-signal default, as Megatron's.
inline constexpr const char* kDefaultExitSignal = "SIGTERM";

// The signal number of an --exit-signal value: SIGTERM, SIGINT, SIGUSR1, SIGUSR2 or SIGHUP
// (case-sensitive, with the SIG prefix, as Megatron spells them). Throws InvalidArgument naming
// --exit-signal, the value and the accepted names otherwise.
int parse_exit_signal(const std::string& name);
// The reverse of parse_exit_signal ("SIGTERM"); InternalError for a signal it does not accept.
const char* exit_signal_name(int signum);

class ExitSignalHandler {
 public:
  // Installs the handler for `signum` (one that parse_exit_signal accepts). InternalError if
  // another ExitSignalHandler exists or the signal is not one of those.
  explicit ExitSignalHandler(int signum);
  // Restores the disposition that was in place before the constructor.
  ~ExitSignalHandler();
  ExitSignalHandler(const ExitSignalHandler&) = delete;
  ExitSignalHandler& operator=(const ExitSignalHandler&) = delete;

  // Whether the signal has been delivered since construction.
  bool received() const;
  int signum() const { return signum_; }

 private:
  int signum_;
  struct sigaction previous_ {};
};

}  // namespace megatron
