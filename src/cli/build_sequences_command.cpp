// `megatron build_sequences_per_dataset`: Megatron core 0.19's
// tools/build_sequences_per_dataset.py. Every distinct dataset prefix of the run's data flags
// (--data-path, --train/valid/test-data-path, or the files --data-args-path and
// --per-split-data-args-path name), in order of first appearance, with its .idx header's two
// counts: {"prefix": [sequences, documents + 1], ...}, the file --per-dataset-sequences-path
// reads (train checks each entry against the .idx it describes).
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "cli/train_args.h"
#include "core/error.h"
#include "core/logging.h"
#include "data/blended_dataset.h"
#include "data/indexed_dataset.h"

namespace megatron::cli {

int build_sequences_command(int argc, char** argv) {
  CLI::App app(
      "The sequences per dataset of a blend for --per-dataset-sequences-path "
      "(tools/build_sequences_per_dataset.py)",
      "build_sequences_per_dataset");
  Arguments a;
  std::string out;
  ArgTable table(app);
  table.add("--data-path", a.data_path, "Dataset prefix, or a blend: weight prefix weight prefix");
  table.add("--train-data-path", a.train_data_path, "Training dataset prefix(es)");
  table.add("--valid-data-path", a.valid_data_path, "Validation dataset prefix(es)");
  table.add("--test-data-path", a.test_data_path, "Test dataset prefix(es)");
  table.add("--data-args-path", a.data_args_path, "A file holding the --data-path arguments");
  table.add("--per-split-data-args-path", a.per_split_data_args_path,
            "A JSON file {\"train\": ..., \"valid\": ..., \"test\": ...} of the split blends");
  table.add("--per-dataset-sequences-path", out, "The JSON file to write (required)");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  MEGATRON_CHECK(!out.empty(), "--per-dataset-sequences-path is required: the JSON file to write");
  read_data_args_files(a);
  std::vector<std::string> prefixes;
  std::set<std::string> seen;
  const std::pair<const std::vector<std::string>*, const char*> blends[] = {
      {&a.data_path, "--data-path"},
      {&a.train_data_path, "--train-data-path"},
      {&a.valid_data_path, "--valid-data-path"},
      {&a.test_data_path, "--test-data-path"}};
  for (const auto& [args, flag] : blends) {
    for (const std::string& p : parse_blend(*args, flag).prefixes)
      if (seen.insert(p).second) prefixes.push_back(p);
  }
  MEGATRON_CHECK(!prefixes.empty(),
                 "no dataset prefix: pass --data-path or --train/valid/test-data-path (or the "
                 "files --data-args-path, --per-split-data-args-path)");
  log_line("Building sequences per dataset...");
  log_line(strprintf("Number of unique file prefixes: %zu", prefixes.size()));
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  for (const std::string& p : prefixes) {
    const IndexedDataset ds = IndexedDataset::open(p);
    counts[p] = {ds.num_sequences(), ds.num_documents() + 1};
  }
  std::ofstream f(out);
  MEGATRON_CHECK(f.good(), "--per-dataset-sequences-path: cannot write '", out, "'");
  f << counts.dump();
  f.close();
  MEGATRON_CHECK(f.good(), "--per-dataset-sequences-path: writing '", out, "' failed");
  log_line("Done! Saving --per-dataset-sequences-path file to " + out);
  return 0;
}

}  // namespace megatron::cli
