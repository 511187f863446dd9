// Tests of the TensorBoard event-file writer: CRC-32C, byte-exact records against fixed vectors,
// files read back by a small parser here, and the error paths (unwritable directory, failed
// write).
//
// The parser below only checks this writer against itself; the byte vectors are what tie it to
// TensorBoard's format, and tests/train/decode_tfevents.py is the independent decoder.
#include "train/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;

std::string to_hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// An empty directory unique to this test and process, removed when the test ends.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_((fs::temp_directory_path() /
               ("megatron_tensorboard_" + std::to_string(getpid()) + "_" + name))
                  .string()) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// ---- A minimal reader: TFRecord framing and the Event fields the writer emits. ----

struct Scalar {
  std::string tag;
  float value = 0;
};

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<Scalar> scalars;
};

uint64_t get_le(std::string_view s, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(s[pos + i])} << (8 * i);
  return v;
}

uint64_t get_varint(std::string_view s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= s.size()) throw std::runtime_error("truncated varint");
    const auto b = static_cast<unsigned char>(s[pos++]);
    v |= uint64_t{b & 0x7Fu} << shift;
    if (!(b & 0x80)) return v;
  }
  throw std::runtime_error("varint too long");
}

std::string_view get_bytes(std::string_view s, size_t& pos) {
  const uint64_t n = get_varint(s, pos);
  if (n > s.size() - pos) throw std::runtime_error("truncated length-delimited field");
  const std::string_view out = s.substr(pos, n);
  pos += n;
  return out;
}

Scalar parse_value(std::string_view s) {
  Scalar v;
  size_t pos = 0;
  bool has_value = false;
  while (pos < s.size()) {
    const uint64_t key = get_varint(s, pos);
    if (key == 0x0A) {
      v.tag = std::string(get_bytes(s, pos));
    } else if (key == 0x15) {
      if (s.size() - pos < 4) throw std::runtime_error("truncated float");
      v.value = std::bit_cast<float>(static_cast<uint32_t>(get_le(s, pos, 4)));
      pos += 4;
      has_value = true;
    } else {
      throw std::runtime_error("unexpected Value field key " + std::to_string(key));
    }
  }
  if (!has_value) throw std::runtime_error("Value without simple_value");
  return v;
}

Event parse_event(std::string_view s) {
  Event e;
  size_t pos = 0;
  while (pos < s.size()) {
    const uint64_t key = get_varint(s, pos);
    if (key == 0x09) {
      if (s.size() - pos < 8) throw std::runtime_error("truncated double");
      e.wall_time = std::bit_cast<double>(get_le(s, pos, 8));
      pos += 8;
    } else if (key == 0x10) {
      e.step = static_cast<int64_t>(get_varint(s, pos));
    } else if (key == 0x1A) {
      e.file_version = std::string(get_bytes(s, pos));
    } else if (key == 0x2A) {
      const std::string_view summary = get_bytes(s, pos);
      size_t sp = 0;
      while (sp < summary.size()) {
        if (get_varint(summary, sp) != 0x0A) throw std::runtime_error("unexpected Summary field");
        e.scalars.push_back(parse_value(get_bytes(summary, sp)));
      }
    } else {
      throw std::runtime_error("unexpected Event field key " + std::to_string(key));
    }
  }
  return e;
}

// Parses every record, checking both CRCs; throws on anything malformed (no truncation allowed).
std::vector<Event> parse_file(const std::string& bytes) {
  std::vector<Event> events;
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) throw std::runtime_error("truncated header");
    const uint64_t len = get_le(bytes, pos, 8);
    if (get_le(bytes, pos + 8, 4) != detail::masked_crc32c(bytes.data() + pos, 8)) {
      throw std::runtime_error("bad length CRC");
    }
    pos += 12;
    if (len + 4 > bytes.size() - pos) throw std::runtime_error("truncated record");
    const std::string_view data(bytes.data() + pos, len);
    if (get_le(bytes, pos + len, 4) != detail::masked_crc32c(data.data(), data.size())) {
      throw std::runtime_error("bad data CRC");
    }
    events.push_back(parse_event(data));
    pos += len + 4;
  }
  return events;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- Tests ----

TEST(Crc32c, CheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros.
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
}

TEST(EncodeEvent, FileVersionRecordMatchesVector) {
  const std::string record =
      detail::frame_record(detail::encode_event(1700000000.0, 0, "brain.Event:2", {}));
  EXPECT_EQ(to_hex(record),
            "1800000000000000a37f4b220900000040fc54d9411a0d627261696e2e4576656e743a32eced8f9d");
}

TEST(EncodeEvent, ScalarRecordMatchesVector) {
  const std::string record =
      detail::frame_record(detail::encode_event(1700000001.0, 1, "", {{"lm loss", 10.5}}));
  EXPECT_EQ(to_hex(record),
            "1d00000000000000602fdf230900004040fc54d94110012a100a0e0a076c6d206c6f73731500002841e4ae"
            "fb74");
}

TEST(EncodeEvent, EdgeValuesRoundTrip) {
  // Negative and large steps take 10-byte varints; a zero value must still be written.
  for (int64_t step : {int64_t{-1}, int64_t{300}, INT64_MAX, INT64_MIN}) {
    const Event e = parse_event(
        detail::encode_event(1.5, step, "", {{"zero", 0.0}, {"neg", -2.25}, {"big", 1e300}}));
    EXPECT_EQ(e.step, step);
    EXPECT_EQ(e.wall_time, 1.5);
    ASSERT_EQ(e.scalars.size(), 3u);
    EXPECT_EQ(e.scalars[0].tag, "zero");
    EXPECT_EQ(e.scalars[0].value, 0.0f);
    EXPECT_EQ(e.scalars[1].value, -2.25f);
    EXPECT_TRUE(std::isinf(e.scalars[2].value));  // float32 overflow, as TensorBoard stores it
  }
  // A tag longer than 127 bytes needs a two-byte length varint.
  const std::string long_tag(200, 'x');
  const Event e = parse_event(detail::encode_event(2.0, 7, "", {{long_tag, 3.0}}));
  ASSERT_EQ(e.scalars.size(), 1u);
  EXPECT_EQ(e.scalars[0].tag, long_tag);
}

TEST(TensorBoardWriter, WritesFileThatParsesBack) {
  const ScratchDir scratch("parse");
  const std::string dir = scratch.path() + "/nested/tb";  // parents created too
  const double start = std::floor(now_seconds());
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir));
    const std::string name = fs::path(path).filename().string();
    // events.out.tfevents.<10-digit seconds>.<host>.<pid>.0 (std::regex avoided: GCC 12 warns
    // inside it under -Werror with sanitizers).
    const std::string prefix = "events.out.tfevents.";
    const std::string suffix = "." + std::to_string(getpid()) + ".0";
    ASSERT_TRUE(name.starts_with(prefix) && name.ends_with(suffix)) << name;
    const std::string seconds = name.substr(prefix.size(), 10);
    EXPECT_TRUE(std::all_of(seconds.begin(), seconds.end(), [](char c) {
      return c >= '0' && c <= '9';
    })) << name;
    EXPECT_EQ(name[prefix.size() + 10], '.') << name;
    EXPECT_GT(name.size(), prefix.size() + 11 + suffix.size()) << name;  // a non-empty host name
    EXPECT_GE(std::stod(seconds), start);

    w.add_scalar("lm loss", 10.5, 1);
    w.add_scalar("learning-rate", 3e-4, 1);
    w.add_scalars({{"lm loss", 9.25}, {"grad-norm", 1.75}, {"loss-scale", 65536.0}}, 2);
    w.add_scalars({}, 3);  // nothing to write
    // Records are written through: a reader sees them before flush().
    EXPECT_EQ(parse_file(read_all(path)).size(), 4u);
    w.flush();
    w.add_scalar("lm loss", 8.0, 1000000000000);
  }
  const std::vector<Event> events = parse_file(read_all(path));
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].scalars.empty());
  for (const Event& e : events) {
    EXPECT_GE(e.wall_time, start);
    EXPECT_LE(e.wall_time, now_seconds() + 1);
  }
  EXPECT_EQ(events[1].step, 1);
  ASSERT_EQ(events[1].scalars.size(), 1u);
  EXPECT_EQ(events[1].scalars[0].tag, "lm loss");
  EXPECT_EQ(events[1].scalars[0].value, 10.5f);
  EXPECT_EQ(events[2].scalars[0].tag, "learning-rate");
  EXPECT_EQ(events[2].scalars[0].value, static_cast<float>(3e-4));
  EXPECT_EQ(events[3].step, 2);
  ASSERT_EQ(events[3].scalars.size(), 3u);
  EXPECT_EQ(events[3].scalars[0].tag, "lm loss");
  EXPECT_EQ(events[3].scalars[0].value, 9.25f);
  EXPECT_EQ(events[3].scalars[1].tag, "grad-norm");
  EXPECT_EQ(events[3].scalars[1].value, 1.75f);
  EXPECT_EQ(events[3].scalars[2].tag, "loss-scale");
  EXPECT_EQ(events[3].scalars[2].value, 65536.0f);
  EXPECT_EQ(events[4].step, 1000000000000);
  EXPECT_EQ(events[4].scalars[0].value, 8.0f);
}

TEST(TensorBoardWriter, TwoWritersInOneDirectoryGetDistinctFiles) {
  const ScratchDir scratch("two");
  const std::string& dir = scratch.path();
  TensorBoardWriter a(dir);
  TensorBoardWriter b(dir);
  EXPECT_NE(a.path(), b.path());
  a.add_scalar("a", 1.0, 1);
  b.add_scalar("b", 2.0, 1);
  a.close();
  b.close();
  EXPECT_EQ(parse_file(read_all(a.path()))[1].scalars[0].tag, "a");
  EXPECT_EQ(parse_file(read_all(b.path()))[1].scalars[0].tag, "b");
}

TEST(TensorBoardWriter, UnwritableDirectoryThrowsNamingPath) {
  const ScratchDir scratch("unwritable");
  const std::string file = scratch.path() + "/regular_file";
  std::ofstream(file) << "not a directory";
  const std::string dir = file + "/tb";
  try {
    TensorBoardWriter w(dir);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  // The path itself being a regular file is refused too.
  EXPECT_THROW(TensorBoardWriter{file}, InvalidArgument);
}

TEST(TensorBoardWriter, BadCallsThrow) {
  const ScratchDir scratch("bad_calls");
  TensorBoardWriter w(scratch.path());
  EXPECT_THROW(w.add_scalar("", 1.0, 1), InvalidArgument);
  w.close();
  w.close();  // idempotent
  EXPECT_THROW(w.add_scalar("lm loss", 1.0, 1), InvalidArgument);
  EXPECT_THROW(w.flush(), InvalidArgument);
  EXPECT_THROW(TensorBoardWriter{""}, InvalidArgument);
}

// A write that fails part way (here: the file-size limit, which the kernel enforces like a full
// disk, mid-record) must throw with the path and the system error and leave only whole records.
TEST(TensorBoardWriter, WriteErrorThrowsAndLeavesWholeRecords) {
  const ScratchDir scratch("write_error");
  TensorBoardWriter w(scratch.path());
  const uintmax_t header = fs::file_size(w.path());
  const size_t record =
      detail::frame_record(detail::encode_event(0, 1, "", {{"lm loss", 1.0}})).size();

  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old_action), 0);
  rlimit limit = old_limit;
  // Room for two records and half of a third.
  limit.rlim_cur = header + 2 * record + record / 2;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);

  int written = 0;
  std::optional<std::string> error;
  for (int i = 1; i <= 10 && !error; ++i) {
    try {
      w.add_scalar("lm loss", 1.0, i);
      ++written;
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &old_action, nullptr);

  ASSERT_TRUE(error.has_value()) << "no write failed";
  EXPECT_EQ(written, 2);
  EXPECT_NE(error->find(w.path()), std::string::npos) << *error;
  EXPECT_NE(error->find(std::strerror(EFBIG)), std::string::npos) << *error;
  EXPECT_EQ(fs::file_size(w.path()), header + 2 * record);

  // With room again the writer carries on after the last whole record.
  w.add_scalar("lm loss", 2.0, 3);
  w.close();
  const std::vector<Event> events = parse_file(read_all(w.path()));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[3].step, 3);
  EXPECT_EQ(events[3].scalars[0].value, 2.0f);
}

}  // namespace
}  // namespace megatron
