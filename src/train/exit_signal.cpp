// The --exit-signal names and the process-wide handler behind ExitSignalHandler.
#include "train/exit_signal.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace megatron {

namespace {

struct NamedSignal {
  const char* name;
  int signum;
};
// Megatron's --exit-signal choices, in its order, plus SIGHUP (sent when a terminal or an ssh
// session that started the job goes away).
constexpr NamedSignal kExitSignals[] = {
    {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT}, {"SIGUSR1", SIGUSR1},
    {"SIGUSR2", SIGUSR2}, {"SIGHUP", SIGHUP},
};
constexpr const char* kAcceptedNames = "SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP";

const NamedSignal* find_signal(int signum) {
  for (const NamedSignal& s : kExitSignals) {
    if (s.signum == signum) return &s;
  }
  return nullptr;
}

// Process-wide, since a signal handler is given nothing but the signal number. std::atomic rather
// than volatile sig_atomic_t: the handler may run on any thread (the kernel picks one that does not
// block the signal), not only on the one that polls received(), and only atomics order the two.
// Lock-free, so the handler never waits for a lock that the interrupted code holds.
std::atomic<bool> g_received{false};
std::atomic<bool> g_installed{false};  // an ExitSignalHandler exists
static_assert(std::atomic<bool>::is_always_lock_free,
              "the exit-signal flag must be lock-free to be touched inside a signal handler");

// Fixed text: the handler may not format (printf and std::string allocate or lock).
constexpr char kSecondSignalMessage[] =
    "megatron: received the exit signal a second time: exiting without saving a checkpoint\n";

// The launcher may stop reading our output once it has decided the job ends (Open MPI's mpirun
// does on SIGTERM), and a rank blocked writing a log line to a full pipe never reaches the save.
// From the exit signal on, stdout and stderr do not block: a line that does not fit is dropped,
// the checkpoint is not. fcntl is async-signal-safe.
void stop_blocking_on_output() {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    const int flags = fcntl(fd, F_GETFL);
    if (flags != -1) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  }
}

// Only async-signal-safe calls here: fcntl, write, sigaction, raise.
void handle_exit_signal(int signum) {
  if (!g_received.exchange(true)) {  // first delivery: the trainer saves and stops
    const int saved_errno = errno;
    stop_blocking_on_output();
    errno = saved_errno;
    return;
  }
  const int saved_errno = errno;
  const ssize_t written =
      write(STDERR_FILENO, kSecondSignalMessage, sizeof(kSecondSignalMessage) - 1);
  (void)written;  // nothing useful to do if stderr is gone; the signal still ends the process
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signum, &default_action, nullptr);
  // The signal is blocked while its handler runs, so this one stays pending until the handler
  // returns and then takes the default action: the process dies of the signal, as the sender
  // expects, rather than exiting with some code of ours.
  raise(signum);
  errno = saved_errno;
}

}  // namespace

int parse_exit_signal(const std::string& name) {
  for (const NamedSignal& s : kExitSignals) {
    if (name == s.name) return s.signum;
  }
  MEGATRON_CHECK(false, "--exit-signal: unknown signal '", name, "' (accepted: ", kAcceptedNames,
                 "; default ", kDefaultExitSignal, ")");
  return -1;  // unreachable
}

const char* exit_signal_name(int signum) {
  const NamedSignal* s = find_signal(signum);
  MEGATRON_ASSERT(s != nullptr, "signal ", signum,
                  " is not an --exit-signal (accepted: ", kAcceptedNames, ")");
  return s->name;
}

ExitSignalHandler::ExitSignalHandler(int signum) : signum_(signum) {
  MEGATRON_ASSERT(find_signal(signum) != nullptr, "signal ", signum,
                  " is not an --exit-signal (accepted: ", kAcceptedNames, ")");
  MEGATRON_ASSERT(!g_installed.exchange(true),
                  "only one ExitSignalHandler may exist at a time (its state is process-wide)");
  g_received.store(false);
  struct sigaction action {};
  action.sa_handler = handle_exit_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: the first delivery must not disturb the step in progress, so system calls it
  // interrupts (reads, socket waits of the collectives) resume instead of failing with EINTR.
  action.sa_flags = SA_RESTART;
  if (sigaction(signum, &action, &previous_) != 0) {
    const int err = errno;
    g_installed.store(false);
    MEGATRON_ASSERT(false, "sigaction(", exit_signal_name(signum),
                    ") failed: ", std::strerror(err));
  }
}

ExitSignalHandler::~ExitSignalHandler() {
  // Restore first, so a delivery after this point goes to the previous disposition and not to a
  // handler whose owner is gone.
  sigaction(signum_, &previous_, nullptr);
  g_received.store(false);
  g_installed.store(false);
}

bool ExitSignalHandler::received() const {
  return g_received.load();
}

}  // namespace megatron
