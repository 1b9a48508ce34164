// Jinja parser: tokens -> statement tree. Rejects constructs serval does not implement
// (include, extends, block, filter blocks, unknown filters and tests) with a LoadError naming
// the construct and its line.
#pragma once
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace serval::tokenizer::jinja {

Body parse(const std::vector<Token>& tokens);

}  // namespace serval::tokenizer::jinja
