// Runs a parsed Jinja template (jinja_parser.h) with the globals transformers gives chat templates.
#pragma once

#include <string>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace tandem::chat {

// Checks that every filter and test the template names is one this interpreter has; throws Error
// "chat template line L col C: unsupported filter 'x'" otherwise (also for branches a render would skip).
void check_supported(const Body& body);

// Renders body with these variables (messages, add_generation_prompt, bos_token, ...) on top of the built-in
// globals (range, namespace, raise_exception, strftime_now, dict). Throws Error with the line and column of
// the failing expression or statement.
std::string render_template(const Body& body, const Dict& variables);

}  // namespace tandem::chat
