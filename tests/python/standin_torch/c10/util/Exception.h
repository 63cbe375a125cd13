/* A stand-in for PyTorch's c10/util/Exception.h, for tests only: just what
 * plugins/torch/gma_torch_shim.cpp and the stand-in torch._C
 * (tests/python/standin_torch/torch_C.cpp) use. c10::Error carries the
 * message (the real one adds a source location and a backtrace, which
 * PyTorch leaves out of the Python message unless TORCH_SHOW_CPP_STACKTRACES
 * is set); c10::OutOfMemoryError derives from it, as in PyTorch;
 * TORCH_CHECK_WITH / TORCH_CHECK throw them with the arguments streamed into
 * one string, as c10::str does.
 *
 * The classes live in namespace gma_standin_c10, which c10 names here, so a
 * library built against this header never defines symbols or type names of
 * the real c10: loaded into real PyTorch, its exceptions would be a plain
 * std::exception (RuntimeError), never mistaken for c10's. */
#pragma once

#include <exception>
#include <sstream>
#include <string>
#include <utility>

namespace gma_standin_c10 {

class Error : public std::exception {
 public:
  explicit Error(std::string msg) : msg_(std::move(msg)) {}
  const char *what() const noexcept override { return msg_.c_str(); }
  const std::string &msg() const { return msg_; }

 private:
  std::string msg_;
};

class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string str(const Args &...args) {
  std::ostringstream s;
  (void)(s << ... << args);
  return s.str();
}
} // namespace detail

} // namespace gma_standin_c10

namespace c10 = gma_standin_c10;

#define TORCH_CHECK_WITH(error_t, cond, ...)                                  \
  do {                                                                        \
    if (!(cond)) throw ::c10::error_t(::c10::detail::str(__VA_ARGS__));       \
  } while (0)
#define TORCH_CHECK(cond, ...) TORCH_CHECK_WITH(Error, cond, __VA_ARGS__)
