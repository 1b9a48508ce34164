// The API error of a failed Engine::submit, for the jobs that submit (generations, embeddings).
#pragma once
#include <string>

#include "base/error.h"
#include "runtime/engine.h"
#include "server/api_error.h"

namespace serval::server {

// Call inside a catch block: rethrows the exception in flight as the API error it answers with
// (503 when the engine's queue is full, 400 naming `param` for an invalid request); any other
// exception as it is.
[[noreturn]] inline void rethrow_submit_error(const std::string& param) {
  try {
    throw;
  } catch (const runtime::QueueFull& e) {
    throw ApiError(503, std::string("the server is overloaded: ") + e.what());
  } catch (const InvalidArgument& e) {
    throw bad_request(param, e.what());
  }
}

}  // namespace serval::server
