// json_dumps and python_float_repr against outputs of Python 3 json.dumps / repr(float).
#include "tokenizer/json_dumps.h"

#include <gtest/gtest.h>

namespace serval::tokenizer {
namespace {

using nlohmann::ordered_json;

TEST(JsonDumps, FloatsLikePythonRepr) {
  // Expected strings: Python's repr(x).
  const std::pair<double, const char*> cases[] = {{1.0, "1.0"},
                                                  {0.1, "0.1"},
                                                  {1e-07, "1e-07"},
                                                  {1e+20, "1e+20"},
                                                  {1e16, "1e+16"},
                                                  {1e15, "1000000000000000.0"},
                                                  {0.0001, "0.0001"},
                                                  {0.00001, "1e-05"},
                                                  {-2.5, "-2.5"},
                                                  {123456789.0, "123456789.0"},
                                                  {0.1 + 0.2, "0.30000000000000004"},
                                                  {1.5e300, "1.5e+300"},
                                                  {-0.0, "-0.0"},
                                                  {2.0 / 3, "0.6666666666666666"},
                                                  {12345.678, "12345.678"},
                                                  {5e-324, "5e-324"}};
  for (auto [x, want] : cases) EXPECT_EQ(python_float_repr(x), want) << want;
}

TEST(JsonDumps, DefaultSeparatorsAndOrder) {
  const auto v = ordered_json::parse(
      R"({"z": 1, "a": [1.0, 0.1, 1e-07, 1e+20, true, false, null], "s": "é\"\\\n\t\u0001/", "e": {}, "l": []})");
  // json.dumps(v, ensure_ascii=False)
  EXPECT_EQ(json_dumps(v),
            "{\"z\": 1, \"a\": [1.0, 0.1, 1e-07, 1e+20, true, false, null], "
            "\"s\": \"é\\\"\\\\\\n\\t\\u0001/\", \"e\": {}, \"l\": []}");
  // json.dumps(v, ensure_ascii=True, sort_keys=True)
  JsonDumpsOptions o;
  o.ensure_ascii = true;
  o.sort_keys = true;
  EXPECT_EQ(json_dumps(ordered_json::parse(R"({"b": "日本🎉", "a": -3})"), o),
            "{\"a\": -3, \"b\": \"\\u65e5\\u672c\\ud83c\\udf89\"}");
}

TEST(JsonDumps, Indent) {
  const auto v = ordered_json::parse(R"({"a": [1, {"b": null}], "c": {}, "d": []})");
  JsonDumpsOptions o;
  o.indent = 2;
  // json.dumps(v, indent=2)
  EXPECT_EQ(json_dumps(v, o),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {},\n"
            "  \"d\": []\n}");
  o.indent = 4;
  EXPECT_EQ(json_dumps(ordered_json::parse(R"([1, "x"])"), o), "[\n    1,\n    \"x\"\n]");
  o.indent = 0;
  EXPECT_EQ(json_dumps(ordered_json::parse(R"([1, 2])"), o), "[\n1,\n2\n]");
}

}  // namespace
}  // namespace serval::tokenizer
