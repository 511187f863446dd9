// Error handling: two check macros, after PyTorch's c10.
//
// MEGATRON_CHECK(cond, ...) guards against caller mistakes (bad flag, bad file, bad shape): it
// throws megatron::InvalidArgument, which the CLI turns into exit code 2. The message should say
// what was expected, what was got, and the fix. MEGATRON_ASSERT(cond, ...) guards internal
// invariants: it throws megatron::InternalError (exit code 1). Messages are built only on failure.
// Library code never exits the process; only src/cli/ catches.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace megatron {

// A caller error: bad input that the user can fix. Exit code 2.
class InvalidArgument : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A broken invariant inside the library: a bug. Exit code 1.
class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace megatron

#define MEGATRON_CHECK(cond, ...)                                                 \
  do {                                                                            \
    if (!(cond)) [[unlikely]] {                                                   \
      throw ::megatron::InvalidArgument(::megatron::detail::concat(__VA_ARGS__)); \
    }                                                                             \
  } while (0)

#define MEGATRON_ASSERT(cond, ...)                                                                \
  do {                                                                                            \
    if (!(cond)) [[unlikely]] {                                                                   \
      throw ::megatron::InternalError(                                                            \
          ::megatron::detail::concat("internal error at ", __FILE__, ":", __LINE__, ": `", #cond, \
                                     "` failed. " __VA_OPT__(, ) __VA_ARGS__));                   \
    }                                                                                             \
  } while (0)
