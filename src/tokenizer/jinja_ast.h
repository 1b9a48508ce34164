// Jinja abstract syntax tree: expressions and statements produced by the parser.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace serval::tokenizer::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args = items
    kTuple,    // args = items
    kDict,     // args = key0, value0, key1, value1, ...
    kGetAttr,  // args[0] . name
    kGetItem,  // args[0] [ args[1] ]
    kSlice,    // args[0] [ args[1] : args[2] : args[3] ]  (each of 1..3 may be null)
    kCall,     // args[0] ( args[1..], kwargs )
    kFilter,   // args[0] | name ( args[1..], kwargs )
    kTest,     // args[0] is [not] name ( args[1..], kwargs )
    kUnary,    // name in {"not", "-", "+"} applied to args[0]
    kBinary,   // args[0] name args[1]; name in {or and + - * / // % ** ~}
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...; ops in {== != < <= > >= in notin}
    kCond,     // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  int depth = 1;  // levels of this subtree (1: no children); the parser bounds it
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,       // text
    kEmit,       // {{ expr }}
    kIf,         // conds[i] -> bodies[i]; bodies.size() == conds.size() + 1 when else exists
    kFor,        // for names in expr [if cond]: bodies[0]; else bodies[1]
    kSet,        // set names (one or more) = expr, or set names[0].attr = expr
    kSetBlock,   // set names[0] %} bodies[0] {% endset
    kMacro,      // macro names[0](names[1..] with defaults conds[i] (null = none)) bodies[0]
    kCallBlock,  // call [(names = caller params)] expr %} bodies[0] {% endcall
    kBreak,
    kContinue,
    kScope,  // generation block: bodies[0] rendered in place
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string attr;
  std::vector<std::string> names;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
};

}  // namespace serval::tokenizer::jinja
