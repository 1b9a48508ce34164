#include "server/cors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace serval::server {
namespace {

constexpr std::string_view kAllMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
// Headers a browser may always send (the CORS "safelisted" request headers).
constexpr std::string_view kSafelisted[] = {"accept", "accept-language", "content-language",
                                            "content-type"};

bool has_star(const std::vector<std::string>& list) {
  return std::find(list.begin(), list.end(), "*") != list.end();
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool origin_allowed(const CorsPolicy& p, std::string_view origin) {
  return has_star(p.origins) ||
         std::find(p.origins.begin(), p.origins.end(), origin) != p.origins.end();
}

std::string join(const std::vector<std::string>& items) {
  return fmt::format("{}", fmt::join(items, ", "));
}

}  // namespace

HeaderList cors_response_headers(const CorsPolicy& policy, std::string_view origin,
                                 bool has_cookie) {
  HeaderList out;
  const bool any_origin = has_star(policy.origins);
  if (any_origin && !has_cookie) {
    out.emplace_back("Access-Control-Allow-Origin", "*");
  } else if (origin_allowed(policy, origin)) {
    // A named origin (cookies forbid "*"); caches must keep responses apart per origin.
    out.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    out.emplace_back("Vary", "Origin");
  }
  if (policy.credentials) out.emplace_back("Access-Control-Allow-Credentials", "true");
  return out;
}

CorsPreflight cors_preflight(const CorsPolicy& policy, std::string_view origin,
                             std::string_view method, std::string_view request_headers) {
  CorsPreflight out;
  std::vector<std::string> failures;
  const bool any_origin = has_star(policy.origins);
  if (!origin_allowed(policy, origin)) {
    failures.push_back("origin");
    if (any_origin) out.headers.emplace_back("Access-Control-Allow-Origin", "*");
  } else if (any_origin && !policy.credentials) {
    out.headers.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    out.headers.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    out.headers.emplace_back("Vary", "Origin");
  }
  const bool any_method = has_star(policy.methods);
  out.headers.emplace_back("Access-Control-Allow-Methods",
                           any_method ? std::string(kAllMethods) : join(policy.methods));
  if (!any_method &&
      std::find(policy.methods.begin(), policy.methods.end(), method) == policy.methods.end())
    failures.push_back("method");
  if (has_star(policy.headers)) {
    if (!request_headers.empty())
      out.headers.emplace_back("Access-Control-Allow-Headers", std::string(request_headers));
  } else {
    std::set<std::string> allowed(std::begin(kSafelisted), std::end(kSafelisted));
    for (const std::string& h : policy.headers) allowed.insert(lower(h));
    std::vector<std::string> listed(allowed.begin(), allowed.end());
    out.headers.emplace_back("Access-Control-Allow-Headers", join(listed));
    std::string_view rest = request_headers;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string name = lower(trim(rest.substr(0, comma)));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (!name.empty() && !allowed.count(name)) {
        failures.push_back("headers");
        break;
      }
    }
  }
  out.headers.emplace_back("Access-Control-Max-Age", "600");
  if (policy.credentials) out.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  if (failures.empty()) {
    out.body = "OK";
  } else {
    out.status = 400;
    out.body = "Disallowed CORS " + join(failures);
  }
  return out;
}

}  // namespace serval::server
