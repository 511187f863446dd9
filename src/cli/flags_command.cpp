// `megatron flags`: Megatron's flag table and what megatron-cpp does with each flag.
#include <cstdio>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "cli/megatron_flags.h"
#include "cli/train_args.h"
#include "core/logging.h"

namespace megatron::cli {

int flags_command(int argc, char** argv) {
  CLI::App app("Megatron's flags (arguments.py, r0.14) and their status in `megatron train`",
               argv[0]);
  bool markdown = false, check = false;
  app.add_flag("--markdown", markdown, "Print docs/FLAGS.md");
  app.add_flag("--check", check,
               "Exit 1, listing the problems, when the table and `megatron train` disagree");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  CLI::App train_app("train");
  Arguments args;
  ArgTable train(train_app);
  register_train_args(train, args);
  if (check) {
    const std::vector<std::string> problems = check_megatron_flags(train);
    for (const std::string& p : problems) log_error(p);
    if (!problems.empty()) return 1;
    std::printf("%zu Megatron flags and %zu of our own agree with `megatron train`\n",
                megatron_flags().size(), own_train_flags().size());
    return 0;
  }
  if (markdown) {
    std::fputs(megatron_flags_markdown(train).c_str(), stdout);
    return 0;
  }
  for (const MegatronFlag& row : megatron_flags()) {
    std::printf("%-50s %-12s %s\n", row.flag.c_str(), row.status.c_str(),
                row.status == "implemented" ? train.help_of(row.flag).c_str() : row.note.c_str());
  }
  return 0;
}

}  // namespace megatron::cli
