// TensorBoard event-file writer for training scalars (loss, learning rate, grad norm, ...).
//
// Writes the files TensorBoard reads, events.out.tfevents.*, without protobuf or TensorFlow: the
// three message types involved (Event, Summary, Summary.Value) are hand-encoded in protobuf wire
// format and framed as TFRecords with masked CRC-32C checksums. It is not a general summary
// writer: only scalars (simple_value) are supported, no histograms, images or text, and there is
// no reader here (tests/train/decode_tfevents.py is an independent one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megatron {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and xorout 0xFFFFFFFF), the checksum
// TFRecord framing uses. crc32c("123456789", 9) == 0xE3069283.
uint32_t crc32c(const void* data, size_t n);

namespace detail {

// TFRecord's masked CRC: a raw CRC of data that itself contains CRCs is weak, so it is rotated and
// offset.
uint32_t masked_crc32c(const void* data, size_t n);

// One Event message in protobuf wire format. step and file_version are left out when zero / empty
// (proto3 defaults, as TensorFlow's writer does); the summary is left out when values is empty.
// Each value becomes a Summary.Value{tag, simple_value} with the value rounded to float32.
std::string encode_event(double wall_time, int64_t step, std::string_view file_version,
                         const std::vector<std::pair<std::string, double>>& values);

// TFRecord framing of one record: u64 LE length, masked CRC of the length bytes, data, masked CRC
// of data.
std::string frame_record(std::string_view data);

}  // namespace detail

// Appends scalar events to one new event file in a directory.
//
// Every add_scalar/add_scalars call writes one whole record to the file at once, so a reader
// (TensorBoard, a test) sees it without waiting for flush() and a crash loses at most the record
// being written. Write errors throw InvalidArgument naming the file and the system error; the file
// is then cut back to its last whole record so it stays readable. Not thread-safe.
class TensorBoardWriter {
 public:
  // Creates dir (and its parents) if needed and opens
  // dir/events.out.tfevents.<10-digit unix seconds>.<hostname>.<pid>.<n>, n = 0 unless a file of
  // that name exists already. Writes the file_version record. Throws InvalidArgument when the
  // directory cannot be created or the file cannot be opened.
  explicit TensorBoardWriter(const std::string& dir);
  // Flushes and closes; errors are reported on stderr, not thrown. Call close() to get them.
  ~TensorBoardWriter();

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` with one scalar. The value is stored as float32, as TensorBoard does.
  void add_scalar(const std::string& tag, double value, int64_t step);
  // One event at `step` with several scalars in one summary.
  void add_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step);
  // Makes the records written so far durable (fsync). Delayed write errors (a full disk under
  // delayed allocation, NFS) surface here at the latest.
  void flush();
  // Flushes and closes the file; later add_* calls throw. Calling it again does nothing.
  void close();

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void write_event(int64_t step, std::string_view file_version,
                   const std::vector<std::pair<std::string, double>>& values);

  std::string path_;
  int fd_ = -1;
  // Size of the file up to its last whole record: where a failed write is cut back to.
  uint64_t size_ = 0;
};

}  // namespace megatron
