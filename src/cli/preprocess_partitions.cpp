// Partition files for `megatron preprocess --partitions` (see the header).
#include "cli/preprocess_partitions.h"

#include <glob.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/logging.h"

namespace megatron::cli {

namespace {

// Reads a file's bytes in chunks (through zlib for .gz, as gzip.open does) and hands whole lines
// to `line` as Python's universal-newline text mode splits them: the line's text without its end,
// and whether it had one.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    gz_ = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
    if (gz_) {
      gzf_ = gzopen(path.c_str(), "rb");
      MEGATRON_CHECK(gzf_ != nullptr, "--input ", path, ": cannot open (", std::strerror(errno),
                     ")");
    } else {
      f_ = std::fopen(path.c_str(), "rb");
      MEGATRON_CHECK(f_ != nullptr, "--input ", path, ": cannot open (", std::strerror(errno), ")");
    }
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  ~LineReader() {
    if (f_) std::fclose(f_);
    if (gzf_) gzclose(gzf_);
  }

  void for_each(const std::function<void(const std::string&, bool)>& line) {
    std::string current;
    std::vector<char> buf(1 << 20);
    bool pending_cr = false;  // a '\r' ended the last line; a '\n' right after it is its part
    for (;;) {
      const size_t n = read(buf.data(), buf.size());
      if (n == 0) break;
      for (size_t i = 0; i < n; ++i) {
        const char c = buf[i];
        if (pending_cr) {
          pending_cr = false;
          if (c == '\n') continue;
        }
        if (c == '\n' || c == '\r') {
          line(current, true);
          current.clear();
          pending_cr = c == '\r';
        } else {
          current.push_back(c);
        }
      }
    }
    if (!current.empty()) line(current, false);
  }

 private:
  size_t read(char* out, size_t cap) {
    if (gz_) {
      const int n = gzread(gzf_, out, static_cast<unsigned>(cap));
      // gzread ends a stream cut short with 0 and Z_BUF_ERROR recorded (gzip.open raises).
      int err = Z_OK;
      const char* msg = gzerror(gzf_, &err);
      MEGATRON_CHECK(
          n >= 0 && (n > 0 || err == Z_OK), "--input ", path_,
          err == Z_BUF_ERROR ? ": the gzip stream is truncated (" : ": cannot decompress (", msg,
          ")");
      return static_cast<size_t>(n);
    }
    const size_t n = std::fread(out, 1, cap, f_);
    MEGATRON_CHECK(n > 0 || !std::ferror(f_), "--input ", path_, ": read failed (",
                   std::strerror(errno), ")");
    return n;
  }

  std::string path_;
  bool gz_ = false;
  std::FILE* f_ = nullptr;
  gzFile gzf_ = nullptr;
};

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);  // sorted by glob
  }
  ::globfree(&g);
  MEGATRON_CHECK(rc == 0 || rc == GLOB_NOMATCH, "--input ", pattern, ": cannot expand the glob");
  MEGATRON_CHECK(!out.empty(), "--input ", pattern,
                 " matches no file (with --partitions the input is a glob of JSON-lines files)");
  return out;
}

}  // namespace

std::pair<std::string, std::string> split_extension(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  size_t first = base;  // leading dots of the basename are not an extension
  while (first < path.size() && path[first] == '.') ++first;
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos || dot < first) return {path, ""};
  return {path.substr(0, dot), path.substr(dot)};
}

std::vector<PartitionFiles> write_partitions(const std::string& input_glob,
                                             const std::string& output_prefix, int64_t partitions,
                                             bool sequential) {
  const auto [root, ext] = split_extension(input_glob);
  std::vector<PartitionFiles> parts;
  bool all_present = true;
  for (int64_t i = 0; i < partitions; ++i) {
    parts.push_back(
        {root + "_" + std::to_string(i) + ext, output_prefix + "_" + std::to_string(i)});
    std::error_code ec;
    all_present = all_present && std::filesystem::exists(parts.back().input, ec);
  }
  if (all_present) {
    log_line("Partition files " + parts.front().input + " ... " + parts.back().input +
             " exist: preprocessing them as they are");
    return parts;
  }
  const std::vector<std::string> files = glob_files(input_glob);
  int64_t partition_size = 1;
  if (sequential) {
    int64_t total = 0;
    for (const std::string& f : files)
      LineReader(f).for_each([&](const std::string&, bool) { ++total; });
    partition_size = std::max<int64_t>(1, (total + partitions - 1) / partitions);
  }
  // Written under temporary names and renamed at the end: an interrupted run leaves no partial
  // partition file that the next run would take as complete.
  struct Partial {
    std::string path;
    std::FILE* f = nullptr;
    ~Partial() {
      if (f) {
        std::fclose(f);
        std::remove(path.c_str());
      }
    }
  };
  std::vector<std::unique_ptr<Partial>> out;
  for (const PartitionFiles& p : parts) {
    auto w = std::make_unique<Partial>();
    w->path = p.input + ".partial";
    w->f = std::fopen(w->path.c_str(), "wb");
    MEGATRON_CHECK(w->f != nullptr, "--partitions: cannot create ", w->path, " (",
                   std::strerror(errno), "); the partition files go next to --input");
    out.push_back(std::move(w));
  }
  int64_t index = 0, line_count = 0;
  for (const std::string& file : files) {
    LineReader(file).for_each([&](const std::string& text, bool ended) {
      // A sequential run can step past the last partition after the last line: nothing follows.
      std::FILE* f = out[static_cast<size_t>(std::min(index, partitions - 1))]->f;
      const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() &&
                      (!ended || std::fputc('\n', f) != EOF);
      MEGATRON_CHECK(ok, "--partitions: cannot write ",
                     parts[static_cast<size_t>(std::min(index, partitions - 1))].input, " (",
                     std::strerror(errno), ")");
      if (sequential) {
        if (++line_count % partition_size == 0) ++index;
      } else {
        index = (index + 1) % partitions;
      }
    });
  }
  for (size_t i = 0; i < out.size(); ++i) {
    // Closed first (a failed flush must not leave a complete-looking file), renamed after.
    const int closed = std::fclose(std::exchange(out[i]->f, nullptr));
    MEGATRON_CHECK(closed == 0 && std::rename(out[i]->path.c_str(), parts[i].input.c_str()) == 0,
                   "--partitions: cannot write ", parts[i].input, " (", std::strerror(errno), ")");
  }
  log_line("Wrote " + std::to_string(partitions) + " partition files " + parts.front().input +
           " ... " + parts.back().input);
  return parts;
}

}  // namespace megatron::cli
