// CORS answers (cors.h) as vLLM's server (Starlette's CORSMiddleware) gives them: every origin,
// method and header by default; named lists otherwise, with the safelisted request headers
// always allowed; 400 "Disallowed CORS ..." naming what a preflight may not do.
#include "server/cors.h"

#include <gtest/gtest.h>

namespace serval::server {
namespace {

std::string header(const HeaderList& headers, const std::string& name) {
  for (const auto& [n, v] : headers)
    if (n == name) return v;
  return "<none>";
}

TEST(Cors, DefaultAllowsEveryOrigin) {
  const CorsPolicy any;
  const HeaderList h = cors_response_headers(any, "https://app.example", false);
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(h, "Access-Control-Allow-Credentials"), "<none>");
  // With cookies the origin is named: "*" does not cover credentialed requests.
  const HeaderList c = cors_response_headers(any, "https://app.example", true);
  EXPECT_EQ(header(c, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(c, "Vary"), "Origin");

  const CorsPreflight p =
      cors_preflight(any, "https://app.example", "POST", "authorization, content-type");
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.body, "OK");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Methods"),
            "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(header(p.headers, "Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_EQ(header(p.headers, "Access-Control-Max-Age"), "600");
  EXPECT_EQ(
      header(cors_preflight(any, "https://a", "GET", "").headers, "Access-Control-Allow-Headers"),
      "<none>");
}

TEST(Cors, NamedListsAndCredentials) {
  CorsPolicy p;
  p.origins = {"https://app.example"};
  p.methods = {"GET", "POST"};
  p.headers = {"Authorization"};
  p.credentials = true;

  const HeaderList ok = cors_response_headers(p, "https://app.example", false);
  EXPECT_EQ(header(ok, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(ok, "Vary"), "Origin");
  EXPECT_EQ(header(ok, "Access-Control-Allow-Credentials"), "true");
  const HeaderList other = cors_response_headers(p, "https://evil.example", false);
  EXPECT_EQ(header(other, "Access-Control-Allow-Origin"), "<none>");

  const CorsPreflight good =
      cors_preflight(p, "https://app.example", "POST", "Authorization, Content-Type");
  EXPECT_EQ(good.status, 200);
  EXPECT_EQ(header(good.headers, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(good.headers, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(header(good.headers, "Access-Control-Allow-Headers"),
            "accept, accept-language, authorization, content-language, content-type");
  EXPECT_EQ(header(good.headers, "Access-Control-Allow-Credentials"), "true");

  const CorsPreflight bad = cors_preflight(p, "https://evil.example", "DELETE", "x-secret");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body, "Disallowed CORS origin, method, headers");
  EXPECT_EQ(header(bad.headers, "Access-Control-Allow-Origin"), "<none>");
  EXPECT_EQ(cors_preflight(p, "https://app.example", "PUT", "").body, "Disallowed CORS method");
}

}  // namespace
}  // namespace serval::server
