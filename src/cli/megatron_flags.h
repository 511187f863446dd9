// Megatron's flag table: every flag of Megatron-LM's arguments.py (r0.14, then the flags core
// 0.19 added) with megatron-cpp's answer to it (src/cli/megatron_flags.tsv and
// megatron_flags_core019.tsv, compiled into the binary), so that a Megatron launch
// script runs as it is: implemented flags are `megatron train`'s own; the others are registered
// here, so that none of them is "unknown". Given, an accepted flag prints one start-up line
// saying what it means in this implementation; a refused one stops the run (exit 2) naming the
// flag, why, and what to use instead.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "cli/arg_table.h"

namespace megatron::cli {

struct MegatronFlag {
  std::string flag;
  std::string values;   // "0" a switch, "1" one value, "*" or "+" a list
  std::string group;    // Megatron's argument group (_add_GROUP_args)
  std::string status;   // implemented, accepted, refused, or "only V"
  std::string note;     // what an accepted flag means here; why a refused one is
  std::string release;  // the Megatron release whose parser added it (core_r0.14.0 or later)
};

// The rows of the table: r0.14's arguments.py in its order, then each later release's additions
// in its parser's order.
const std::vector<MegatronFlag>& megatron_flags();

// The flags of `megatron train` that Megatron does not have, each with why it exists.
struct OwnFlag {
  const char* flag;
  const char* why;
};
const std::vector<OwnFlag>& own_train_flags();

// Registers every row of the table that `table` does not implement, each into storage of its
// own (concern "megatron-compat"); lives as long as the table.
//
// `command` is the command whose table it is. Megatron's tools (the text-generation server,
// tasks/main.py) parse the whole of arguments.py, so a launch line written for them carries
// training flags; for an inference command (generate, serve, evaluate) the rows `megatron train`
// implements and `table` lacks are accepted with what they mean there (nothing, mostly), except
// the few that would ask for a layout inference does not run (--context-parallel-size other
// than 1). "train" (and `plan`, which takes train's flags) keeps the table's rows as they are.
class MegatronCompatFlags {
 public:
  explicit MegatronCompatFlags(ArgTable& table, const std::string& command = "train");
  // After parsing: one start-up line per accepted flag given ("FLAG VALUE: meaning"); a refused
  // flag given (or an "only V" one given another value) throws InvalidArgument naming it.
  std::vector<std::string> resolve() const;

 private:
  struct Registered {
    const MegatronFlag* row;
    std::string* value = nullptr;
    std::vector<std::string>* list = nullptr;
    bool* on = nullptr;
  };
  const ArgTable& table_;
  std::deque<MegatronFlag> inference_rows_;  // train's flags as an inference command takes them
  std::deque<std::string> values_;
  std::deque<std::vector<std::string>> lists_;
  std::deque<bool> switches_;
  std::vector<Registered> registered_;
};

// The table against `train`'s ArgTable: the problems (an implemented row the table lacks, a row
// whose flag the table implements but the row does not say so, a flag of ours missing from
// own_train_flags()); empty when they agree.
std::vector<std::string> check_megatron_flags(const ArgTable& train);

// docs/FLAGS.md: the table with each implemented flag's help text, then our own flags.
std::string megatron_flags_markdown(const ArgTable& train);

}  // namespace megatron::cli
