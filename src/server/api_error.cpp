// OpenAI error bodies.
#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace serval::server {

const char* error_type(int status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 403:
      return "PermissionDeniedError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowed";
    case 413:
      return "RequestTooLargeError";
    case 422:
      return "UnprocessableEntityError";
    case 429:
      return "RateLimitError";
    case 503:
      return "ServiceUnavailableError";
    default:
      return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

std::string error_json(int status, const std::string& message, const std::string& param) {
  nlohmann::ordered_json e = {
      {"message", message},
      {"type", error_type(status)},
      {"param", param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(param)},
      {"code", status}};
  return nlohmann::ordered_json({{"error", e}})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace serval::server
