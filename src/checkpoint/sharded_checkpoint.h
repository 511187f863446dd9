// Sharded checkpoints: Megatron's directory layout, our global-tensor format, and the commit
// protocol that never lets a half-written checkpoint become the latest.
//
//   <root>/latest_checkpointed_iteration.txt   the tracker: the newest committed iteration
//   <root>/iter_0000100/metadata.json           the commit point, written last (by rank 0)
//   <root>/iter_0000100/rank_00003.safetensors  world rank 3's boxes (ranks with none: no file)
//
// Every tensor (model weights, fp32 main weights, Adam moments) is described by its global shape
// and the boxes its shards cover; a shard file holds each box as a dense f32 safetensors tensor
// named "<tensor>@<offset>" (offsets as "row,col"). metadata.json lists, per tensor, its shape and
// shards (file, key, offset, extent, XXH3-64 of the payload), per file its size and SHA-256, and
// the run state the trainer adds (iteration, consumed samples, schedule, loss scaler, RNG seed,
// model arguments, layout).
// A load reads exactly the boxes its layout needs, from whatever layout saved them: resharding is
// a load, not a conversion. docs/CHECKPOINTS.md describes the format for other readers.
//
// Saving, on every rank of the world:
//   prepare_save   rank 0 (re)creates <root>/iter_N.staging                       [collective]
//   write_rank_file  this rank's file into the staging directory: temporary name, fsync, rename
//                  (no communication, so it can run on a background thread: --async-save)
//   commit_save    all ranks agree the writes succeeded; rank 0 writes metadata.json the same
//                  way, renames the staging directory to iter_N, then rewrites the tracker [coll.]
// If any write failed, every rank throws AgreedFailure with the failing rank's errno and path;
// the staging directory is removed and the previous checkpoint and the tracker are untouched. A
// directory without metadata.json is never loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checksum.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_boxes.h"
#include "comm/process_group.h"

namespace megatron::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr char kFormatName[] = "megatron-cpp sharded checkpoint";
inline constexpr char kTrackerFile[] = "latest_checkpointed_iteration.txt";
inline constexpr char kMetadataFile[] = "metadata.json";

// "iter_0000100", and root joined with it.
std::string iteration_dir_name(int64_t iteration);
std::string iteration_dir(const std::string& root, int64_t iteration);
// The tracker's iteration, or nullopt when root has no tracker. Anything but a non-negative
// decimal number (Megatron's "release" included) is an error naming the file.
std::optional<int64_t> read_tracker(const std::string& root);

// One box of one global tensor, as this rank contributes it.
struct ShardEntry {
  std::string tensor;
  std::vector<int64_t> global_shape;
  Box box;
  Tensor data;  // f32, contiguous, box.extent elements (a view into live buffers or a copy)
};

// Collective. Rank 0 creates root if needed and an empty <root>/iter_N.staging; returns its path.
std::string prepare_save(ProcessGroup& world, const std::string& root, int64_t iteration);

// Writes this rank's entries to <staging>/rank_<world rank>.safetensors (nothing when there are
// none) and returns its record for metadata.json (empty object when nothing was written).
// No communication. Throws InvalidArgument naming the file and the system's reason on failure.
// after_tensor, when given, runs after each tensor's bytes are written; false fails the write
// (the fault-injection tests kill the process there, mid-write, or fail it as a full disk).
nlohmann::json write_rank_file(const std::string& staging, int world_rank,
                               const std::vector<ShardEntry>& entries,
                               const std::function<bool()>& after_tensor = {});

// Collective. `record` is write_rank_file's result on this rank, or `error` its failure message
// (then record is ignored). Agrees on success, then rank 0 writes metadata.json (the records
// and `state`, a JSON object of the trainer's run state), commits the directory and the tracker.
// Throws AgreedFailure on every rank when any rank failed. Returns the bytes of all the ranks'
// files together.
int64_t commit_save(ProcessGroup& world, const std::string& root, int64_t iteration,
                    const std::string& staging, const nlohmann::json& record,
                    const std::string& error, const nlohmann::json& state);

// A committed checkpoint directory, opened for reading the boxes a layout needs.
class CheckpointReader {
 public:
  // Validates dir/metadata.json and that every shard file it lists exists with its recorded
  // size. integrity: kTensors (the default) also compares each shard tensor's XXH3-64 with
  // metadata.json when read() first uses it; kTensorsAndFiles also each file's SHA-256 when it
  // is first read (--verify-integrity); kSizesOnly neither (--no-verify-integrity). Errors name
  // the file, the tensor and the fix.
  static CheckpointReader open(const std::string& dir, Integrity integrity = Integrity::kTensors);

  const std::string& dir() const { return dir_; }
  // metadata.json, as read.
  const nlohmann::json& metadata() const { return meta_; }
  bool has(const std::string& tensor) const { return tensors_.count(tensor) != 0; }
  // The saved global shape; error naming the tensor and metadata.json when it is absent.
  const std::vector<int64_t>& global_shape(const std::string& tensor) const;
  // Fills dst, a dense f32 array of want.extent, with box `want` of `tensor`. Where `want` lies
  // outside the saved global shape (only allowed when allow_outside: the vocabulary padding rows
  // change with the tensor-parallel size) the elements are zero.
  void read(const std::string& tensor, const Box& want, float* dst, bool allow_outside = false);
  // Tensor bytes copied out by read() so far.
  int64_t bytes_read() const { return bytes_read_; }

 private:
  struct Shard {
    std::string file, key;
    Box box;
    std::string xxh3;  // of the shard's payload, empty in checkpoints written before checksums
  };
  struct TensorInfo {
    std::vector<int64_t> shape;
    std::vector<Shard> shards;
  };
  const safetensors::File& file(const std::string& name);

  std::string dir_;
  Integrity integrity_ = Integrity::kTensors;
  std::set<std::string> checked_;  // "file/key" of the shards whose checksum matched
  nlohmann::json meta_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> sha256_;  // file -> recorded digest
  std::map<std::string, std::unique_ptr<safetensors::File>> open_;
  int64_t bytes_read_ = 0;
};

// Hex SHA-256 of a file's bytes; error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace megatron::checkpoint
