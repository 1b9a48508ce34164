// Cross-origin resource sharing (CORS) for browser clients, as vLLM's server does it (Starlette's
// CORSMiddleware, with vLLM's defaults: every origin, method and header allowed, no credentials;
// `serve --allowed-origins/--allowed-methods/--allowed-headers/--allow-credentials`).
//   - A preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered by the
//     HTTP layer itself, before routing or the API key: 200 "OK", or 400 "Disallowed CORS
//     origin, method, headers" naming what is not allowed.
//   - Any other request with an Origin header gets the allow headers on its response, whatever
//     the response (a disallowed origin gets none, and the browser then hides the response).
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace serval::server {

struct CorsPolicy {
  std::vector<std::string> origins = {"*"};  // "*": any
  std::vector<std::string> methods = {"*"};  // "*": DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT
  std::vector<std::string> headers = {"*"};  // "*": whatever the preflight asks for
  bool credentials = false;                  // Access-Control-Allow-Credentials: true
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The CORS headers of the response to a (non-preflight) request from `origin` (non-empty);
// has_cookie: the request carried cookies (an allowed origin is then named, not "*").
HeaderList cors_response_headers(const CorsPolicy& policy, std::string_view origin,
                                 bool has_cookie);

struct CorsPreflight {
  int status = 200;
  HeaderList headers;
  std::string body;  // text/plain
};

// The answer to a preflight from `origin` asking for `method` and (when present, else empty)
// the comma-separated `request_headers`.
CorsPreflight cors_preflight(const CorsPolicy& policy, std::string_view origin,
                             std::string_view method, std::string_view request_headers);

}  // namespace serval::server
