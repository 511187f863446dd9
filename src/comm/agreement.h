// Agreement: failures that every rank of a group learns about together.
//
// MPI has no way to tell a peer "stop, I failed" while it waits in a collective, so a rank that
// throws alone must abort the whole job (MPI_Abort), and the other ranks may die before they
// have printed anything. Where a piece of work involves no communication (reading arguments,
// checking or reading checkpoint files), we can do better: every rank runs it, then one
// all-reduce tells every rank whether any failed, and all of them throw the same AgreedFailure,
// with the lowest failing rank's message, at the same point. The CLI then prints it on every
// rank and exits cleanly with its code (2 for bad input), without MPI_Abort.
//
// Not for work that communicates: a rank that fails inside a collective would leave the others
// waiting in it, and only MPI_Abort ends that.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"

namespace megatron {

class AgreedFailure : public std::runtime_error {
 public:
  AgreedFailure(const std::string& message, int exit_code, int failing_rank,
                std::vector<std::string> messages = {})
      : std::runtime_error(message),
        exit_code_(exit_code),
        failing_rank_(failing_rank),
        messages_(std::move(messages)) {}
  // 2 when the failure was bad input (InvalidArgument), else 1.
  int exit_code() const { return exit_code_; }
  // The lowest group rank that failed; its message is what() on every rank.
  int failing_rank() const { return failing_rank_; }
  // Every member's own message by group rank, when the failure carries them
  // (agree_on_each_failure);
  // else empty.
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  int exit_code_;
  int failing_rank_;
  std::vector<std::string> messages_;
};

// Every member's string, in group-rank order. Collective.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine);
// Root's `text` on every member (a command for ranks that follow the root). Collective.
void broadcast_string(ProcessGroup& group, std::string& text, int root);

// Runs `work` (which must not communicate) on every member of `group`; if it throws on any of
// them, every member throws AgreedFailure. The message is the lowest failing rank's, prefixed
// with "rank R: " when the group has more than one member and it is not this rank's own.
// Collective: one all-reduce when all succeed.
void run_agreed(ProcessGroup& group, const std::function<void()>& work);

// Agrees on a failure detected outside run_agreed: `error` is this rank's message (empty when it
// did not fail) and `exit_code` its code. Throws AgreedFailure on every member when any failed.
void agree_on_failure(ProcessGroup& group, const std::string& error, int exit_code);

// For a check that finds different things on different ranks: when any member `failed`, every
// member throws AgreedFailure with `exit_code` carrying each member's own `account` (what it found,
// or that it stops for the others). `group` is the world: the CLI prints the accounts as one block,
// a line per world rank, and every rank exits cleanly (MPI_Abort could kill a rank before its line
// is out). Collective: one all-reduce when none failed.
void agree_on_each_failure(ProcessGroup& group, bool failed, const std::string& account,
                           int exit_code);

}  // namespace megatron
