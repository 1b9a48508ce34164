// Jinja evaluator.
#include "tokenizer/jinja_evaluator.h"

#include <cstdint>
#include <memory>
#include <string>

#include "base/error.h"
#include "tokenizer/jinja_filters.h"
#include "tokenizer/jinja_ops.h"

namespace serval::tokenizer::jinja {
namespace {

// A render error that already carries its line; passed through unchanged.
class LocatedError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

struct Scope {
  ValueDict vars;
  std::shared_ptr<Scope> parent;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (const Value* v = s->vars.find(name)) return v;
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

// Per-render budgets. A chat template runs on every request: one that recurses without end,
// loops past any real conversation's size or builds gigabytes of text is an error (the parser
// already bounds the nesting of blocks and expressions: jinja_parser.cpp).
constexpr int kMaxMacroDepth = 32;             // macro calls in progress
constexpr int64_t kMaxIterations = 1'000'000;  // for-loop iterations, all loops together

// out += text, within kMaxTextBytes for any one output buffer.
void append(std::string& out, const std::string& text) {
  check_text_size(out.size() + text.size(), "the rendered text");
  out += text;
}

class Evaluator {
 public:
  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec_located(*s, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  Flow exec_located(const Stmt& s, const ScopePtr& scope, std::string& out) {
    try {
      return exec(s, scope, out);
    } catch (const LocatedError&) {
      throw;
    } catch (const Error& e) {
      throw LocatedError("chat template error at line " + std::to_string(s.line) + ": " + e.what());
    }
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        append(out, s.text);
        return Flow::kNormal;
      case Stmt::Kind::kEmit:
        append(out, eval(*s.expr, scope).str());
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (eval(*s.conds[i], scope).truthy()) return exec_body(s.bodies[i], scope, out);
        if (s.bodies.size() > s.conds.size()) return exec_body(s.bodies.back(), scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        exec_set(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        exec_body(s.bodies[0], scope, captured);
        scope->vars.set(s.names[0], Value::string(captured));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->vars.set(s.names[0], make_macro(s, scope, s.names[0]));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Value caller = make_macro(s, scope, "caller");
        const Expr& call = *s.expr;
        CallArgs args = eval_args(call, scope);
        args.keyword.emplace_back("caller", caller);
        append(out, call_value(eval(*call.args[0], scope), args).str());
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kScope:
        return exec_body(s.bodies[0], scope, out);
    }
    return Flow::kNormal;
  }

  void bind_targets(const std::vector<std::string>& names, const Value& v, Scope& scope) {
    if (names.size() == 1) {
      scope.vars.set(names[0], v);
      return;
    }
    const ValueList items = iterate(v);
    if (items.size() != names.size())
      throw InvalidArgument("cannot unpack " + std::to_string(items.size()) + " values into " +
                            std::to_string(names.size()) + " names");
    for (size_t i = 0; i < names.size(); ++i) scope.vars.set(names[i], items[i]);
  }

  void count_iteration() {
    spend(1);
    if (++iterations_ > kMaxIterations)
      throw InvalidArgument("more than " + std::to_string(kMaxIterations) +
                            " loop iterations in one render");
  }

  void exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    ValueList items = iterate(eval(*s.expr, scope));
    if (s.cond) {
      // `for x in seq if cond`: filtered before loop.* is computed.
      ValueList kept;
      for (const auto& item : items) {
        count_iteration();
        auto probe = std::make_shared<Scope>();
        probe->parent = scope;
        bind_targets(s.names, item, *probe);
        if (eval(*s.cond, probe).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      count_iteration();
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      ValueDict loop;
      loop.set("index", Value::integer(i + 1));
      loop.set("index0", Value::integer(i));
      loop.set("revindex", Value::integer(n - i));
      loop.set("revindex0", Value::integer(n - i - 1));
      loop.set("first", Value::boolean(i == 0));
      loop.set("last", Value::boolean(i == n - 1));
      loop.set("length", Value::integer(n));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
      loop.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value());
      loop.set("cycle", Value::function("loop.cycle", [i](const CallArgs& a) {
                 if (a.positional.empty()) throw InvalidArgument("no items for cycling given");
                 return a.positional[static_cast<size_t>(i) % a.positional.size()];
               }));
      inner->vars.set("loop", Value::dict(std::move(loop)));
      bind_targets(s.names, items[static_cast<size_t>(i)], *inner);
      if (exec_body(s.bodies[0], inner, out) == Flow::kBreak) break;
    }
    if (n == 0 && s.bodies.size() > 1) exec_body(s.bodies[1], scope, out);
  }

  void exec_set(const Stmt& s, const ScopePtr& scope) {
    const Value v = eval(*s.expr, scope);
    if (!s.attr.empty()) {
      const Value* target = scope->lookup(s.names[0]);
      if (!target || !target->is_namespace())
        throw InvalidArgument("cannot assign attribute '" + s.attr + "' on '" + s.names[0] +
                              "': not a namespace object");
      Value::check_namespace_content(v);
      target->namespace_dict().set(s.attr, v);
      return;
    }
    bind_targets(s.names, v, *scope);
  }

  // A macro (or the caller of a call block): parameters bind positionally or by keyword;
  // missing ones take their default, evaluated at call time, or Undefined.
  // One macro call in progress for the scope of the object (kMaxMacroDepth).
  class MacroCall {
   public:
    explicit MacroCall(Evaluator& ev) : ev_(ev) {
      if (++ev_.macro_depth_ > kMaxMacroDepth) {
        --ev_.macro_depth_;
        throw InvalidArgument("macro calls nested deeper than " + std::to_string(kMaxMacroDepth) +
                              " (unbounded recursion?)");
      }
    }
    ~MacroCall() { --ev_.macro_depth_; }
    MacroCall(const MacroCall&) = delete;
    MacroCall& operator=(const MacroCall&) = delete;

   private:
    Evaluator& ev_;
  };

  Value make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name) {
    const Stmt* def = &s;
    // The closure holds its defining scope weakly: that scope usually holds the macro.
    std::weak_ptr<Scope> weak = scope;
    return Value::function(name, [this, def, weak](const CallArgs& a) {
      const MacroCall call(*this);
      auto inner = std::make_shared<Scope>();
      inner->parent = weak.lock();
      if (!inner->parent) throw InvalidArgument("macro called after its scope ended");
      const size_t nparams = def->names.size() - 1;
      ValueList varargs;
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (i < nparams)
          inner->vars.set(def->names[i + 1], a.positional[i]);
        else
          varargs.push_back(a.positional[i]);
      }
      ValueDict kwargs;
      for (const auto& [k, v] : a.keyword) {
        bool is_param = false;
        for (size_t p = 0; p < nparams; ++p) is_param |= def->names[p + 1] == k;
        if (is_param || k == "caller")
          inner->vars.set(k, v);
        else
          kwargs.set(k, v);
      }
      for (size_t p = a.positional.size(); p < nparams; ++p) {
        const std::string& pname = def->names[p + 1];
        if (inner->vars.find(pname)) continue;
        inner->vars.set(pname, def->conds[p] ? eval(*def->conds[p], inner) : Value());
      }
      inner->vars.set("varargs", Value::list(varargs));
      inner->vars.set("kwargs", Value::dict(kwargs));
      std::string out;
      exec_body(def->bodies[0], inner, out);
      return Value::string(out);
    });
  }

  CallArgs eval_args(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    for (size_t i = 1; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, scope));
    return args;
  }

  Value call_value(const Value& callee, const CallArgs& args) {
    if (!callee.is_function())
      throw InvalidArgument("'" + callee.type_name() + "' object is not callable");
    return callee.as_function()(args);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = scope->lookup(e.name);
        return v ? *v : Value();
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return e.kind == Expr::Kind::kList ? Value::list(items) : Value::tuple(items);
      }
      case Expr::Kind::kDict: {
        ValueDict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i], scope);
          if (!k.is_string())
            throw InvalidArgument("dict keys must be strings in serval templates");
          d.set(k.as_string(), eval(*e.args[i + 1], scope));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::kGetAttr:
        return get_attr(eval(*e.args[0], scope), e.name);
      case Expr::Kind::kGetItem:
        return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::kSlice: {
        auto opt = [&](const ExprPtr& p) { return p ? eval(*p, scope) : Value(); };
        return slice(eval(*e.args[0], scope), opt(e.args[1]), opt(e.args[2]), opt(e.args[3]));
      }
      case Expr::Kind::kCall:
        return call_value(eval(*e.args[0], scope), eval_args(e, scope));
      case Expr::Kind::kFilter:
        return apply_filter(e.name, eval(*e.args[0], scope), eval_args(e, scope));
      case Expr::Kind::kTest: {
        const bool r = apply_test(e.name, eval(*e.args[0], scope), eval_args(e, scope));
        return Value::boolean(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.args[0], scope);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (!v.is_number())
          throw InvalidArgument("bad operand type for unary " + e.name + ": '" + v.type_name() +
                                "'");
        if (e.name == "+") return v.is_bool() ? Value::integer(v.as_bool()) : v;
        if (v.is_float()) return Value::number(-v.as_double());
        const int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
        if (i == INT64_MIN) integer_overflow("-");
        return Value::integer(-i);
      }
      case Expr::Kind::kBinary: {
        const Value a = eval(*e.args[0], scope);
        if (e.name == "and") return a.truthy() ? eval(*e.args[1], scope) : a;
        if (e.name == "or") return a.truthy() ? a : eval(*e.args[1], scope);
        return binary_op(e.name, a, eval(*e.args[1], scope));
      }
      case Expr::Kind::kCompare: {
        Value lhs = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value rhs = eval(*e.args[i + 1], scope);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==")
            ok = values_equal(lhs, rhs);
          else if (op == "!=")
            ok = !values_equal(lhs, rhs);
          else if (op == "<")
            ok = values_less(lhs, rhs);
          else if (op == ">")
            ok = values_less(rhs, lhs);
          else if (op == "<=")
            ok = !values_less(rhs, lhs);
          else if (op == ">=")
            ok = !values_less(lhs, rhs);
          else if (op == "in")
            ok = contains(rhs, lhs);
          else
            ok = !contains(rhs, lhs);
          if (!ok) return Value::boolean(false);
          lhs = std::move(rhs);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCond:
        if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value();
    }
    return Value();
  }

  int macro_depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace

std::string render(const Body& body, const ValueDict& globals) {
  // Under a second of work; real chat templates use well under 10^5 units.
  const RenderBudget budget(20'000'000);
  auto root = std::make_shared<Scope>();
  root->vars = globals;
  auto top = std::make_shared<Scope>();
  top->parent = root;
  std::string out;
  Evaluator().exec_body(body, top, out);
  return out;
}

}  // namespace serval::tokenizer::jinja
