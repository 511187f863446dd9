// preprocess_data.py's --partitions: the input files' lines dealt into partition files that are
// preprocessed one by one and merged (the caller encodes and merges; this writes the partitions).
//
// As the tool: --input is a glob; partition i reads `<input stem>_<i><input extension>` (the
// stem and extension of the --input string itself, glob characters included, split as Python's
// os.path.splitext splits) and writes `<output-prefix>_<i>_<key>_<level>`. When every partition
// file exists already they are reused as they are; otherwise every line of every matching file
// (in sorted name order; gzip-compressed when the name ends in .gz) goes to partition
// (line number mod partitions), or with --keep-sequential-samples to partition
// floor(line number / ceil(lines / partitions)), so that the merged output keeps the input order.
// Lines are read as Python's text mode reads them: "\n", "\r\n" and "\r" each end a line and are
// written as "\n"; a last line without one is written without one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megatron::cli {

struct PartitionFiles {
  std::string input;          // the partition's JSON lines
  std::string output_prefix;  // <output-prefix>_<i>
};

// Python's os.path.splitext: {root, extension}, the extension starting at the basename's last
// dot unless that dot only leads the basename.
std::pair<std::string, std::string> split_extension(const std::string& path);

// The partition files of `input_glob`, written unless all exist. Errors (no file matches, a file
// cannot be read or written) name the flag and the file.
std::vector<PartitionFiles> write_partitions(const std::string& input_glob,
                                             const std::string& output_prefix, int64_t partitions,
                                             bool sequential);

}  // namespace megatron::cli
