// Jinja global functions available to chat templates.
#include <ctime>

#include "base/error.h"
#include "tokenizer/jinja_evaluator.h"
#include "tokenizer/jinja_ops.h"

namespace serval::tokenizer::jinja {
namespace {

// Jinja's sandbox refuses ranges longer than this.
constexpr int64_t kMaxRange = 100000;

int64_t int_arg(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  throw InvalidArgument(std::string(what) + ": '" + v.type_name() +
                        "' object cannot be interpreted as an integer");
}

Value range(const CallArgs& a) {
  int64_t start = 0, stop = 0, step = 1;
  const auto& p = a.positional;
  if (p.size() == 1) {
    stop = int_arg(p[0], "range");
  } else if (p.size() == 2 || p.size() == 3) {
    start = int_arg(p[0], "range");
    stop = int_arg(p[1], "range");
    if (p.size() == 3) step = int_arg(p[2], "range");
  } else {
    throw InvalidArgument("range expected 1 to 3 arguments, got " + std::to_string(p.size()));
  }
  if (step == 0) throw InvalidArgument("range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange)
      throw InvalidArgument("range too big, maximum size for range is " +
                            std::to_string(kMaxRange));
    out.push_back(Value::integer(i));
  }
  return Value::list(out);
}

// namespace(...) and dict(...): an optional mapping positional argument, then keywords.
ValueDict mapping_args(const CallArgs& a, const char* what) {
  ValueDict d;
  if (a.positional.size() > 1)
    throw InvalidArgument(std::string(what) + " takes at most one positional argument");
  if (!a.positional.empty()) {
    if (!a.positional[0].is_dict())
      throw InvalidArgument(std::string(what) + " needs a mapping, got " +
                            a.positional[0].type_name());
    d = a.positional[0].as_dict();
  }
  for (const auto& [k, v] : a.keyword) d.set(k, v);
  return d;
}

Value strftime_now(const CallArgs& a) {
  const Value fmt = arg(a, 0, "format");
  if (!fmt.is_string()) throw InvalidArgument("strftime_now needs a format string");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof(buf), fmt.as_string().c_str(), &local);
  return Value::string(std::string(buf, n));
}

}  // namespace

ValueDict builtin_globals() {
  ValueDict g;
  g.set("range", Value::function("range", range));
  g.set("namespace", Value::function("namespace", [](const CallArgs& a) {
          return Value::make_namespace(mapping_args(a, "namespace"));
        }));
  g.set("dict", Value::function("dict", [](const CallArgs& a) {
          return Value::dict(mapping_args(a, "dict"));
        }));
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
          throw InvalidArgument(arg(a, 0, "message").str());
        }));
  g.set("strftime_now", Value::function("strftime_now", strftime_now));
  return g;
}

}  // namespace serval::tokenizer::jinja
