// OpenAI-style API errors: an HTTP status plus {"error":{"message","type","param","code"}}.
#pragma once
#include <string>

#include "base/error.h"

namespace serval::server {

// Thrown by request handlers; the router turns it into the error response.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = "")
      : Error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }  // the offending field, may be empty

 private:
  int status_;
  std::string param_;
};

inline ApiError bad_request(std::string param, std::string message) {
  return ApiError(400, std::move(message), std::move(param));
}

// The OpenAI error type name of a status ("BadRequestError", "NotFoundError", ...).
const char* error_type(int status);

// The response body for an error. `param` empty → null.
std::string error_json(int status, const std::string& message, const std::string& param = "");

}  // namespace serval::server
