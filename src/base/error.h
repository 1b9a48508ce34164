// Error types thrown inside the engine; the HTTP boundary turns them into OpenAI errors.
#pragma once
#include <source_location>
#include <stdexcept>
#include <string>

namespace serval {

// Base of every serval error. `what()` says what is wrong and where.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file (checkpoint, config, tokenizer) is missing, malformed or inconsistent.
class LoadError : public Error {
 public:
  using Error::Error;
};

// A caller passed a value outside the contract (bad flag, bad request field).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Resources (memory, KV blocks) do not suffice.
class OutOfResources : public Error {
 public:
  using Error::Error;
};

// Internal invariant violated: a bug. Carries the source location.
[[noreturn]] void fail_check(const char* expr, const std::string& msg,
                             std::source_location loc = std::source_location::current());

inline void check(bool ok, const char* what,
                  std::source_location loc = std::source_location::current()) {
  if (!ok) fail_check(what, "", loc);
}

}  // namespace serval
