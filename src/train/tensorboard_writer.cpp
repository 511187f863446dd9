// TensorBoard event-file writer: protobuf wire encoding, TFRecord framing, CRC-32C and file I/O.
//
// The encoding covers exactly the fields TensorBoard needs for scalars; it is not a protobuf
// library. Field numbers and wire types come from tensorflow/core/util/event.proto and
// tensorflow/core/framework/summary.proto.
#include "train/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/logging.h"

namespace megatron {

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire-format tags: (field number << 3) | wire type.
constexpr char kEventWallTime = 0x09;     // Event.wall_time = 1, double (fixed64)
constexpr char kEventStep = 0x10;         // Event.step = 2, int64 (varint)
constexpr char kEventFileVersion = 0x1A;  // Event.file_version = 3, string
constexpr char kEventSummary = 0x2A;      // Event.summary = 5, message
constexpr char kSummaryValue = 0x0A;      // Summary.value = 1, repeated message
constexpr char kValueTag = 0x0A;          // Summary.Value.tag = 1, string
constexpr char kValueSimple = 0x15;       // Summary.Value.simple_value = 2, float (fixed32)

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Fixed-width fields are little-endian on the wire whatever the host's byte order.
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_bytes_field(std::string& out, char tag, std::string_view bytes) {
  out.push_back(tag);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

namespace detail {

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string encode_event(double wall_time, int64_t step, std::string_view file_version,
                         const std::vector<std::pair<std::string, double>>& values) {
  std::string out;
  out.push_back(kEventWallTime);
  put_le(out, std::bit_cast<uint64_t>(wall_time), 8);
  // A negative int64 is a 10-byte varint of its two's complement, as protobuf encodes it.
  if (step != 0) {
    out.push_back(kEventStep);
    put_varint(out, static_cast<uint64_t>(step));
  }
  if (!file_version.empty()) put_bytes_field(out, kEventFileVersion, file_version);
  if (!values.empty()) {
    std::string summary;
    for (const auto& [tag, value] : values) {
      std::string v;
      put_bytes_field(v, kValueTag, tag);
      // simple_value is in a oneof, so it is written even when 0 (unlike a plain proto3 field).
      v.push_back(kValueSimple);
      put_le(v, std::bit_cast<uint32_t>(static_cast<float>(value)), 4);
      put_bytes_field(summary, kSummaryValue, v);
    }
    put_bytes_field(out, kEventSummary, summary);
  }
  return out;
}

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out.append(data);
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

}  // namespace detail

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  MEGATRON_CHECK(!dir.empty(), "TensorBoard directory is empty; pass a directory path");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MEGATRON_CHECK(!ec, "cannot create TensorBoard directory '", dir, "': ", ec.message(),
                 "; pass a writable directory path");
  MEGATRON_CHECK(std::filesystem::is_directory(dir, ec), "TensorBoard directory '", dir,
                 "' exists but is not a directory; pass a directory path");

  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string stem =
      strprintf("events.out.tfevents.%010lld.%s.%d.", static_cast<long long>(now),
                host_name().c_str(), static_cast<int>(getpid()));
  // O_EXCL: two writers opened in the same second by the same process (a test, a restart in
  // place) must not truncate each other's file, so the last number counts up instead.
  int open_err = 0;
  for (int n = 0;; ++n) {
    path_ = (std::filesystem::path(dir) / (stem + std::to_string(n))).string();
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    open_err = errno;
    if (fd_ >= 0 || open_err != EEXIST || n >= 1000) break;
  }
  MEGATRON_CHECK(fd_ >= 0, "cannot create TensorBoard event file '", path_,
                 "': ", std::strerror(open_err), "; pass a writable directory");
  try {
    write_event(0, "brain.Event:2", {});
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    log_error(e.what());
  }
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalars({{tag, value}}, step);
}

void TensorBoardWriter::add_scalars(const std::vector<std::pair<std::string, double>>& values,
                                    int64_t step) {
  // An empty set of scalars is not worth an event; callers building the list conditionally
  // should not have to special-case it.
  if (values.empty()) return;
  for (const auto& [tag, value] : values) {
    MEGATRON_CHECK(!tag.empty(), "TensorBoard scalar tag is empty (step ", step,
                   "); give every scalar a name");
  }
  write_event(step, {}, values);
}

void TensorBoardWriter::write_event(int64_t step, std::string_view file_version,
                                    const std::vector<std::pair<std::string, double>>& values) {
  MEGATRON_CHECK(fd_ >= 0, "TensorBoard event file '", path_,
                 "' is closed; write scalars before close()");
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string record =
      detail::frame_record(detail::encode_event(now, step, file_version, values));
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n =
        ::pwrite(fd_, record.data() + done, record.size() - done, static_cast<off_t>(size_ + done));
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = (n == 0) ? EIO : errno;
    // A partial record would make every later record unreadable, so cut the file back to its last
    // whole record; if even that fails the file is closed so nothing is appended after garbage.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
    MEGATRON_CHECK(false, "cannot write TensorBoard event file '", path_, "': ", std::strerror(err),
                   "; free space or pass another --tensorboard-dir");
  }
  size_ += record.size();
}

void TensorBoardWriter::flush() {
  MEGATRON_CHECK(fd_ >= 0, "TensorBoard event file '", path_, "' is closed; flush before close()");
  MEGATRON_CHECK(::fsync(fd_) == 0, "cannot flush TensorBoard event file '", path_,
                 "': ", std::strerror(errno), "; free space or pass another --tensorboard-dir");
}

void TensorBoardWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  const bool closed = ::close(fd) == 0;
  const int close_err = errno;
  MEGATRON_CHECK(synced, "cannot flush TensorBoard event file '", path_,
                 "': ", std::strerror(sync_err), "; free space or pass another --tensorboard-dir");
  MEGATRON_CHECK(closed, "cannot close TensorBoard event file '", path_,
                 "': ", std::strerror(close_err), "; free space or pass another --tensorboard-dir");
}

}  // namespace megatron
