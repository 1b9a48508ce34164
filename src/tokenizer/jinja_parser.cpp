// Jinja parser: recursive descent with jinja2/parser.py's operator precedence.
#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "base/error.h"
#include "tokenizer/jinja_filters.h"

namespace serval::tokenizer::jinja {
namespace {

// Deepest nesting of blocks, of the parser's recursion, and of any expression tree: the parser,
// the evaluator and the AST's destructors all recurse, so a template nested deeper (hostile or
// broken: jinja2 itself ends in a RecursionError) must be refused here instead of overflowing
// the stack. Real chat templates nest fewer than 20 levels.
constexpr int kMaxNesting = 100;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_all() {
    Body body = subparse({});
    return body;
  }

 private:
  [[noreturn]] void fail(const std::string& what, int line = -1) const {
    throw LoadError("chat template syntax error at line " +
                    std::to_string(line < 0 ? cur().line : line) + ": " + what);
  }

  // One level of the parser's recursion (blocks, parenthesized / bracketed expressions, unary
  // chains) for the scope of the object.
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.nesting_ > kMaxNesting)
        p_.fail("nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nest() { --p_.nesting_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };
  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const {
    return cur().type == TokenType::kOperator && cur().value == op;
  }
  bool is_name(const char* name) const {
    return cur().type == TokenType::kName && cur().value == name;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
    ++pos_;
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail("expected a name, got " + describe(cur()));
    return t_[pos_++].value;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) fail("expected '%}', got " + describe(cur()));
    ++pos_;
  }
  static std::string describe(const Token& tok) {
    switch (tok.type) {
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kVariableEnd:
        return "'}}'";
      case TokenType::kEnd:
        return "end of template";
      case TokenType::kString:
        return "string literal";
      default:
        return "'" + tok.value + "'";
    }
  }

  // Parses statements until a block tag whose name is in `end_tags` (left unconsumed: pos_ at
  // its name) or the end of input (only allowed when end_tags is empty).
  Body subparse(const std::set<std::string>& end_tags) {
    const Nest nest(*this);
    Body body;
    while (true) {
      const Token& tok = cur();
      if (tok.type == TokenType::kEnd) {
        if (!end_tags.empty()) {
          std::string closing = *end_tags.begin();
          for (const auto& t : end_tags)
            if (t.rfind("end", 0) == 0) closing = t;
          fail("unexpected end of template, expected '{% " + closing + " %}'");
        }
        return body;
      }
      if (tok.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = tok.line;
        s->text = tok.value;
        body.push_back(std::move(s));
        ++pos_;
      } else if (tok.type == TokenType::kVariableBegin) {
        ++pos_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kEmit;
        s->line = tok.line;
        s->expr = parse_tuple_or_expr();
        if (cur().type != TokenType::kVariableEnd) fail("expected '}}', got " + describe(cur()));
        ++pos_;
        body.push_back(std::move(s));
      } else if (tok.type == TokenType::kBlockBegin) {
        ++pos_;
        if (cur().type != TokenType::kName) fail("expected a tag name, got " + describe(cur()));
        if (end_tags.count(cur().value)) return body;
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(tok));
      }
    }
  }

  StmtPtr make(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  StmtPtr parse_statement() {
    const std::string tag = cur().value;
    const int line = cur().line;
    ++pos_;
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "call") return parse_call_block(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' outside of a for loop", line);
      expect_block_end();
      return make(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
    }
    if (tag == "generation") {
      expect_block_end();
      auto s = make(Stmt::Kind::kScope, line);
      s->bodies.push_back(subparse({"endgeneration"}));
      ++pos_;
      expect_block_end();
      return s;
    }
    static const std::set<std::string> kUnsupported = {
        "include", "import",     "from", "extends", "block",    "filter",
        "with",    "autoescape", "do",   "trans",   "pluralize"};
    if (kUnsupported.count(tag))
      throw LoadError("chat template uses unsupported construct '{% " + tag + " %}' at line " +
                      std::to_string(line));
    fail("unknown tag '" + tag + "'", line);
  }

  StmtPtr parse_if(int line) {
    auto s = make(Stmt::Kind::kIf, line);
    s->conds.push_back(parse_tuple_or_expr());
    expect_block_end();
    while (true) {
      s->bodies.push_back(subparse({"elif", "else", "endif"}));
      const std::string tag = cur().value;
      ++pos_;
      if (tag == "elif") {
        s->conds.push_back(parse_tuple_or_expr());
        expect_block_end();
      } else if (tag == "else") {
        expect_block_end();
        s->bodies.push_back(subparse({"endif"}));
        ++pos_;
        expect_block_end();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) ++pos_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++pos_;
      if (cur().type != TokenType::kName) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(int line) {
    auto s = make(Stmt::Kind::kFor, line);
    s->names = parse_targets();
    if (!is_name("in")) fail("expected 'in' in for loop, got " + describe(cur()));
    ++pos_;
    s->expr = parse_tuple_or_expr(/*no_condexpr=*/true);
    if (is_name("if")) {
      ++pos_;
      s->cond = parse_expression();
    }
    if (is_name("recursive"))
      throw LoadError("chat template uses unsupported construct 'recursive' loop at line " +
                      std::to_string(line));
    expect_block_end();
    ++loop_depth_;
    s->bodies.push_back(subparse({"else", "endfor"}));
    --loop_depth_;
    if (cur().value == "else") {
      ++pos_;
      expect_block_end();
      s->bodies.push_back(subparse({"endfor"}));
    }
    ++pos_;
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    std::vector<std::string> names = {expect_name()};
    std::string attr;
    if (is_op(".")) {
      ++pos_;
      attr = expect_name();
    } else {
      while (is_op(",")) {
        ++pos_;
        names.push_back(expect_name());
      }
    }
    if (cur().type == TokenType::kBlockEnd) {
      if (names.size() != 1 || !attr.empty()) fail("block set needs a single name", line);
      ++pos_;
      auto s = make(Stmt::Kind::kSetBlock, line);
      s->names = names;
      s->bodies.push_back(subparse({"endset"}));
      ++pos_;
      expect_block_end();
      return s;
    }
    expect_op("=");
    auto s = make(Stmt::Kind::kSet, line);
    s->names = std::move(names);
    s->attr = attr;
    s->expr = parse_tuple_or_expr();
    expect_block_end();
    return s;
  }

  // Parameter list "(a, b=default, ...)" into names/defaults.
  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.conds.empty() || s.names.size() > 1) expect_op(",");
      if (is_op(")")) break;
      s.names.push_back(expect_name());
      if (is_op("=")) {
        ++pos_;
        s.conds.push_back(parse_expression());
      } else {
        s.conds.push_back(nullptr);
      }
    }
    ++pos_;
  }

  StmtPtr parse_macro(int line) {
    auto s = make(Stmt::Kind::kMacro, line);
    s->names.push_back(expect_name());
    parse_params(*s);
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->bodies.push_back(subparse({"endmacro"}));
    loop_depth_ = saved;
    ++pos_;
    if (cur().type == TokenType::kName) ++pos_;  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make(Stmt::Kind::kCallBlock, line);
    s->names.push_back("caller");
    if (is_op("(")) parse_params(*s);
    s->expr = parse_expression();
    if (s->expr->kind != Expr::Kind::kCall) fail("expected a call after '{% call'", line);
    expect_block_end();
    s->bodies.push_back(subparse({"endcall"}));
    ++pos_;
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // `e` with its children attached: sets its depth, refusing trees deeper than kMaxNesting
  // (chains such as a + b + ... or x|f|f|... grow them without the parser recursing).
  ExprPtr sealed(ExprPtr e) {
    int deepest = 0;
    for (const ExprPtr& a : e->args)
      if (a) deepest = std::max(deepest, a->depth);
    for (const auto& kw : e->kwargs)
      if (kw.second) deepest = std::max(deepest, kw.second->depth);
    e->depth = deepest + 1;
    if (e->depth > kMaxNesting)
      fail("expression nested deeper than " + std::to_string(kMaxNesting) + " levels", e->line);
    return e;
  }

  ExprPtr parse_tuple_or_expr(bool no_condexpr = false) {
    const int line = cur().line;
    ExprPtr first = no_condexpr ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    auto t = node(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (cur().type == TokenType::kBlockEnd || cur().type == TokenType::kVariableEnd ||
          is_name("if"))
        break;
      t->args.push_back(no_condexpr ? parse_or() : parse_expression());
    }
    return sealed(std::move(t));
  }

  ExprPtr parse_expression() {
    const Nest nest(*this);
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      ++pos_;
      auto c = node(Expr::Kind::kCond, line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(expr));
      if (is_name("else")) {
        ++pos_;
        c->args.push_back(parse_expression());
      } else {
        c->args.push_back(nullptr);
      }
      expr = sealed(std::move(c));
    }
    return expr;
  }

  ExprPtr binary(const std::string& op, ExprPtr lhs, ExprPtr rhs, int line) {
    auto b = node(Expr::Kind::kBinary, line);
    b->name = op;
    b->args.push_back(std::move(lhs));
    b->args.push_back(std::move(rhs));
    return sealed(std::move(b));
  }

  ExprPtr parse_or() {
    ExprPtr lhs = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      ++pos_;
      lhs = binary("or", std::move(lhs), parse_and(), line);
    }
    return lhs;
  }

  ExprPtr parse_and() {
    ExprPtr lhs = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      ++pos_;
      lhs = binary("and", std::move(lhs), parse_not(), line);
    }
    return lhs;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const Nest nest(*this);
      auto u = node(Expr::Kind::kUnary, cur().line);
      ++pos_;
      u->name = "not";
      u->args.push_back(parse_not());
      return sealed(std::move(u));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        op = cur().value;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        op = "notin";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? sealed(std::move(cmp)) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr lhs = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().value;
      const int line = cur().line;
      ++pos_;
      lhs = binary(op, std::move(lhs), parse_concat(), line);
    }
    return lhs;
  }

  ExprPtr parse_concat() {
    ExprPtr lhs = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      ++pos_;
      lhs = binary("~", std::move(lhs), parse_math2(), line);
    }
    return lhs;
  }

  ExprPtr parse_math2() {
    ExprPtr lhs = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      ++pos_;
      lhs = binary(op, std::move(lhs), parse_pow(), line);
    }
    return lhs;
  }

  ExprPtr parse_pow() {
    ExprPtr lhs = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      ++pos_;
      lhs = binary("**", std::move(lhs), parse_unary(true), line);
    }
    return lhs;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr expr;
    if (is_op("-") || is_op("+")) {
      const Nest nest(*this);
      auto u = node(Expr::Kind::kUnary, cur().line);
      u->name = cur().value;
      ++pos_;
      u->args.push_back(parse_unary(false));
      expr = sealed(std::move(u));
    } else {
      expr = parse_primary();
    }
    expr = parse_postfix(std::move(expr));
    if (with_filter) expr = parse_filter_expr(std::move(expr));
    return expr;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    const int line = tok.line;
    auto lit = [&](Value v) {
      auto e = node(Expr::Kind::kLiteral, line);
      e->literal = std::move(v);
      return e;
    };
    if (tok.type == TokenType::kName) {
      ++pos_;
      const std::string& n = tok.value;
      if (n == "true" || n == "True") return lit(Value::boolean(true));
      if (n == "false" || n == "False") return lit(Value::boolean(false));
      if (n == "none" || n == "None") return lit(Value::none());
      auto e = node(Expr::Kind::kName, line);
      e->name = n;
      return e;
    }
    if (tok.type == TokenType::kString) {
      std::string s;
      while (cur().type == TokenType::kString) s += t_[pos_++].value;  // adjacent literals join
      return lit(Value::string(std::move(s)));
    }
    if (tok.type == TokenType::kInteger) {
      ++pos_;
      errno = 0;
      const long long v = std::strtoll(tok.value.c_str(), nullptr, 10);
      if (errno == ERANGE)  // Python's integers are unbounded; ours are 64-bit
        fail("integer literal " + tok.value + " does not fit in 64 bits", line);
      return lit(Value::integer(v));
    }
    if (tok.type == TokenType::kFloat) {
      ++pos_;
      return lit(Value::number(std::strtod(tok.value.c_str(), nullptr)));
    }
    if (is_op("(")) {
      ++pos_;
      if (is_op(")")) {
        ++pos_;
        return node(Expr::Kind::kTuple, line);
      }
      ExprPtr inner = parse_expression();
      if (is_op(",")) {
        auto t = node(Expr::Kind::kTuple, line);
        t->args.push_back(std::move(inner));
        while (is_op(",")) {
          ++pos_;
          if (is_op(")")) break;
          t->args.push_back(parse_expression());
        }
        inner = sealed(std::move(t));
      }
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      ++pos_;
      auto l = node(Expr::Kind::kList, line);
      while (!is_op("]")) {
        if (!l->args.empty()) expect_op(",");
        if (is_op("]")) break;
        l->args.push_back(parse_expression());
      }
      ++pos_;
      return sealed(std::move(l));
    }
    if (is_op("{")) {
      ++pos_;
      auto d = node(Expr::Kind::kDict, line);
      while (!is_op("}")) {
        if (!d->args.empty()) expect_op(",");
        if (is_op("}")) break;
        d->args.push_back(parse_expression());
        expect_op(":");
        d->args.push_back(parse_expression());
      }
      ++pos_;
      return sealed(std::move(d));
    }
    fail("unexpected " + describe(tok));
  }

  // Call arguments after '(' up to and including ')'.
  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("'*args' / '**kwargs' in calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator &&
          peek().value == "=") {
        std::string key = t_[pos_].value;
        pos_ += 2;
        call.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!call.kwargs.empty()) fail("positional argument after keyword argument");
        call.args.push_back(parse_expression());
      }
    }
    ++pos_;
  }

  ExprPtr parse_postfix(ExprPtr expr) {
    while (true) {
      const int line = cur().line;
      if (is_op(".")) {
        ++pos_;
        auto g = node(Expr::Kind::kGetAttr, line);
        if (cur().type == TokenType::kInteger) {
          g->kind = Expr::Kind::kGetItem;
          g->args.push_back(std::move(expr));
          auto idx = node(Expr::Kind::kLiteral, line);
          idx->literal = Value::integer(std::strtoll(cur().value.c_str(), nullptr, 10));
          ++pos_;
          g->args.push_back(std::move(idx));
        } else {
          g->name = expect_name();
          g->args.push_back(std::move(expr));
        }
        expr = sealed(std::move(g));
      } else if (is_op("[")) {
        ++pos_;
        expr = parse_subscript(std::move(expr), line);
      } else if (is_op("(")) {
        auto c = node(Expr::Kind::kCall, line);
        c->args.push_back(std::move(expr));
        parse_call_args(*c);
        expr = sealed(std::move(c));
      } else {
        return expr;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        if (++colons > 2) fail("too many ':' in slice");
        ++pos_;
        continue;
      }
      if (parts[colons]) fail("expected ':' or ']' in subscript");
      parts[colons] = parse_expression();
    }
    ++pos_;
    if (colons == 0) {
      if (!parts[0]) fail("empty subscript");
      auto g = node(Expr::Kind::kGetItem, line);
      g->args.push_back(std::move(obj));
      g->args.push_back(std::move(parts[0]));
      return sealed(std::move(g));
    }
    auto s = node(Expr::Kind::kSlice, line);
    s->args.push_back(std::move(obj));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return sealed(std::move(s));
  }

  ExprPtr parse_filter_expr(ExprPtr expr) {
    while (true) {
      const int line = cur().line;
      if (is_op("|")) {
        ++pos_;
        auto f = node(Expr::Kind::kFilter, line);
        f->name = expect_name();
        while (is_op(".")) {
          ++pos_;
          f->name += "." + expect_name();
        }
        if (!is_known_filter(f->name))
          throw LoadError("chat template uses unsupported filter '" + f->name + "' at line " +
                          std::to_string(line));
        f->args.push_back(std::move(expr));
        if (is_op("(")) parse_call_args(*f);
        expr = sealed(std::move(f));
      } else if (is_name("is")) {
        ++pos_;
        auto t = node(Expr::Kind::kTest, line);
        if (is_name("not")) {
          ++pos_;
          t->negated = true;
        }
        t->name = expect_name();
        if (!is_known_test(t->name))
          throw LoadError("chat template uses unsupported test '" + t->name + "' at line " +
                          std::to_string(line));
        t->args.push_back(std::move(expr));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString ||
                    cur().type == TokenType::kInteger || cur().type == TokenType::kFloat ||
                    is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        expr = sealed(std::move(t));
      } else {
        return expr;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;  // levels of recursion open (Nest)
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  return Parser(tokens).parse_all();
}

}  // namespace serval::tokenizer::jinja
