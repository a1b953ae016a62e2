// Jinja sources of the built-in chat templates (--chat-template NAME), for models whose GGUF has no
// tokenizer.chat_template. Written for this project after the formats the model families document.
#pragma once

#include <string>
#include <vector>

namespace tandem::chat {

// The source of a built-in template, or nullptr for an unknown name.
const char* builtin_template_source(const std::string& name);
std::vector<std::string> builtin_template_names();

}  // namespace tandem::chat
