// Agreement over a group: one all-reduce for the verdict, the messages gathered only on failure.
#include "comm/agreement.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace megatron {

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine) {
  if (group.size() == 1) return {mine};
  // Four bytes per i32 word, every member padded to the longest.
  Tensor len = Tensor::empty({1}, DType::kI64);
  len.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  group.all_reduce(len, ReduceOp::kMax);
  const int64_t longest = len.data<int64_t>()[0];
  const int64_t words = (longest + 4) / 4 + 1;  // one word for the length
  Tensor in = Tensor::zeros({words}, DType::kI32);
  in.data<int32_t>()[0] = static_cast<int32_t>(mine.size());
  std::memcpy(in.data<int32_t>() + 1, mine.data(), mine.size());
  Tensor out = Tensor::empty({words * group.size()}, DType::kI32);
  group.all_gather(out, in);
  std::vector<std::string> all;
  for (int r = 0; r < group.size(); ++r) {
    const int32_t* w = out.data<int32_t>() + static_cast<int64_t>(r) * words;
    all.emplace_back(reinterpret_cast<const char*>(w + 1), static_cast<size_t>(w[0]));
  }
  return all;
}

void broadcast_string(ProcessGroup& group, std::string& text, int root) {
  if (group.size() == 1) return;
  Tensor len = Tensor::empty({1}, DType::kI64);
  len.data<int64_t>()[0] = static_cast<int64_t>(text.size());
  group.broadcast(len, root);
  const int64_t bytes = len.data<int64_t>()[0];
  Tensor words = Tensor::zeros({(bytes + 3) / 4 + 1}, DType::kI32);
  if (group.rank() == root) std::memcpy(words.data<int32_t>(), text.data(), text.size());
  group.broadcast(words, root);
  text.assign(reinterpret_cast<const char*>(words.data<int32_t>()), static_cast<size_t>(bytes));
}

void agree_on_failure(ProcessGroup& group, const std::string& error, int exit_code) {
  const bool failed = !error.empty();
  Tensor verdict = Tensor::empty({1}, DType::kI64);
  verdict.data<int64_t>()[0] = failed ? exit_code : 0;
  group.all_reduce(verdict, ReduceOp::kMax);
  const int code = static_cast<int>(verdict.data<int64_t>()[0]);
  if (code == 0) return;
  const std::vector<std::string> messages = all_gather_strings(group, error);
  int first = 0;
  while (first < group.size() && messages[first].empty()) ++first;
  MEGATRON_ASSERT(first < group.size(), "a failure was agreed on but no rank has a message");
  std::string message = messages[first];
  if (first != group.rank()) message = "rank " + std::to_string(first) + ": " + message;
  throw AgreedFailure(message, code, first);
}

void agree_on_each_failure(ProcessGroup& group, bool failed, const std::string& account,
                           int exit_code) {
  Tensor verdict = Tensor::full({1}, failed ? 1.0 : 0.0, DType::kF64);
  group.all_reduce(verdict, ReduceOp::kMax);
  if (verdict.data<double>()[0] == 0) return;
  throw AgreedFailure(account, exit_code, 0, all_gather_strings(group, account));
}

void run_agreed(ProcessGroup& group, const std::function<void()>& work) {
  std::string error;
  int code = 0;
  try {
    work();
  } catch (const AgreedFailure&) {
    throw;  // already agreed, on every member
  } catch (const InvalidArgument& e) {
    error = e.what();
    code = 2;
  } catch (const std::exception& e) {
    error = e.what();
    code = 1;
  }
  // An exception with an empty message still has to count as a failure.
  if (code != 0 && error.empty()) error = "failed without a message";
  agree_on_failure(group, error, code);
}

}  // namespace megatron
