// Jinja source -> syntax tree. Whitespace control is applied while lexing, as jinja2 does with the settings
// transformers uses (trim_blocks, lstrip_blocks) and the `-`/`+` tag modifiers. Throws tandem::Error
// "chat template line L col C: ..." for a syntax error or a construct this subset does not support.
#pragma once

#include <string>

#include "chat/jinja_ast.h"

namespace tandem::chat {

Body parse_template(const std::string& source);

}  // namespace tandem::chat
