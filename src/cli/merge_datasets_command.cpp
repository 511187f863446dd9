// `megatron merge_datasets`: Megatron's tools/merge_datasets.py. Every `<name>.bin`/`<name>.idx`
// pair of the --input folder, in sorted name order, is appended to one indexed dataset
// `<output-prefix>.bin/.idx` (IndexedDatasetBuilder::add_index): the sequences, the document
// boundaries and the token bytes as they are, in the first dataset's dtype, byte for byte what
// the tool writes. --multimodal merges Megatron's multimodal datasets (sequence modes).
//
// As the tool: every plain file of the folder must be half of a pair (anything else is refused,
// naming it; sub-folders are skipped), the output's folder must exist, and the datasets must share
// one dtype. Beyond it: an empty folder, an output prefix that names one of the inputs, and an
// output that would be read while being written are refused with their reason instead of a
// Python traceback or a corrupt result; nothing appears under the output names unless the whole
// merge succeeds.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "cli/preprocess_partitions.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/timer.h"
#include "data/indexed_dataset.h"

namespace megatron::cli {

namespace {

namespace fs = std::filesystem;

struct MergeArgs {
  std::string input;          // --input: folder of .bin/.idx pairs (required)
  std::string output_prefix;  // --output-prefix: the merged dataset without .bin/.idx (required)
  bool multimodal = false;    // --multimodal
};

// The prefixes of the folder's pairs, sorted as Python sorts str (code points: UTF-8 bytes in
// order, which std::string's comparison gives).
std::vector<std::string> pair_prefixes(const std::string& folder) {
  std::set<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;  // the tool's isfile(): folders are skipped
    const std::string name = it->path().filename().string();
    // os.path.splitext's split (leading dots of a name are not an extension).
    const auto [stem, ext] = split_extension(name);
    // The tool pairs any other file with a .idx it then asserts; its message, with the fix.
    const std::string pair = ext == ".idx" ? ".bin" : ".idx";
    const fs::path partner = fs::path(folder) / (stem + pair);
    std::error_code partner_ec;
    MEGATRON_CHECK(
        fs::is_regular_file(partner, partner_ec), "--input ", folder, ": ", pair,
        " file not provided for ", (fs::path(folder) / stem).string(),
        ext == ".bin" || ext == ".idx"
            ? ""
            : " (the folder must hold only .bin/.idx pairs: move " + name + " out of it)");
    names.insert(stem);
  }
  MEGATRON_CHECK(!ec, "--input ", folder, ": cannot list (", ec.message(), ")");
  return {names.begin(), names.end()};
}

}  // namespace

int merge_datasets_command(int argc, char** argv) {
  CLI::App app("Merge Megatron indexed datasets (.bin/.idx) into one (tools/merge_datasets.py)",
               "merge_datasets");
  MergeArgs a;
  ArgTable table(app);
  table.add("--input", a.input, "Path to directory containing all document files to merge");
  table.add("--output-prefix", a.output_prefix, "Path to binary output file without suffix");
  table.flag("--multimodal", a.multimodal, "Whether the datasets are assumed to be multimodal");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  MEGATRON_CHECK(!a.input.empty(), "--input is required: the folder of .bin/.idx pairs to merge");
  MEGATRON_CHECK(!a.output_prefix.empty(),
                 "--output-prefix is required: the merged dataset's path without .bin/.idx");
  std::error_code dir_ec;
  MEGATRON_CHECK(fs::is_directory(a.input, dir_ec), "--input ", a.input,
                 " is not a directory or does not exist");
  const fs::path out_dir = fs::path(a.output_prefix).parent_path();
  MEGATRON_CHECK(fs::is_directory(out_dir.empty() ? fs::path(".") : out_dir, dir_ec),
                 "--output-prefix ", a.output_prefix, ": ", out_dir.string(),
                 " is not a directory or does not exist");

  const std::vector<std::string> prefixes = pair_prefixes(a.input);
  MEGATRON_CHECK(!prefixes.empty(), "--input ", a.input,
                 " holds no .bin/.idx pairs: nothing to merge");
  // Writing over an input while reading it would merge a half-written file (the tool would).
  std::error_code ec;
  for (const std::string& p : prefixes) {
    const fs::path in = fs::path(a.input) / p;
    for (const char* ext : {".bin", ".idx"}) {
      MEGATRON_CHECK(!fs::equivalent(in.string() + ext, a.output_prefix + ext, ec),
                     "--output-prefix ", a.output_prefix, " names the input ", in.string(), ext,
                     ": write the merged dataset elsewhere");
    }
  }

  const Timer timer;
  log_line(strprintf("Merging %zu datasets from %s", prefixes.size(), a.input.c_str()));
  std::unique_ptr<IndexedDatasetBuilder> builder;
  int64_t sequences = 0, documents = 0;
  for (const std::string& p : prefixes) {
    const IndexedDataset ds = IndexedDataset::open((fs::path(a.input) / p).string(), a.multimodal);
    // The output takes the first dataset's dtype, as the tool's builder does.
    if (!builder)
      builder = std::make_unique<IndexedDatasetBuilder>(a.output_prefix + ".bin", ds.dtype(),
                                                        a.multimodal);
    builder->add_index(ds);
    sequences += ds.num_sequences();
    documents += ds.num_documents();
  }
  builder->finalize(a.output_prefix + ".idx");
  log_line(strprintf("Wrote %s.bin/.idx: %ld documents, %ld sequences, in %.2f s",
                     a.output_prefix.c_str(), static_cast<long>(documents),
                     static_cast<long>(sequences), timer.elapsed()));
  return 0;
}

}  // namespace megatron::cli
