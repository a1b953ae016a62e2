#include "chat/builtin_templates.h"

#include <utility>

namespace tandem::chat {
namespace {

// ChatML (Qwen, many fine-tunes): <|im_start|>role\ncontent<|im_end|>\n per message.
constexpr const char* kChatml = R"({%- for message in messages -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%})";

// Llama 3 / 3.1 / 3.3 headers, without the tool and date preamble of the 3.1 template.
constexpr const char* kLlama3 = R"({{- bos_token -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%})";

// Gemma 2/3 turns; the system message is prefixed to the first user turn, assistant is "model".
constexpr const char* kGemma = R"({{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- set ns.system = message.content | trim + '\n\n' -%}
{%- else -%}
{%- set role = 'model' if message.role == 'assistant' else message.role -%}
{{- '<start_of_turn>' + role + '\n' + (ns.system if message.role == 'user' else '') + message.content | trim + '<end_of_turn>\n' -}}
{%- if message.role == 'user' -%}{%- set ns.system = '' -%}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%})";

// Mistral instruct (v3 "tekken" spacing): [INST]user[/INST]assistant</s>; the system message goes before the
// last user message.
constexpr const char* kMistral = R"({{- bos_token -}}
{%- set ns = namespace(system='', last_user=-1) -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}{%- set ns.system = message.content -%}{%- endif -%}
{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
{%- if loop.index0 == ns.last_user and ns.system -%}
{{- '[INST]' + ns.system + '\n\n' + message.content + '[/INST]' -}}
{%- else -%}
{{- '[INST]' + message.content + '[/INST]' -}}
{%- endif -%}
{%- elif message.role == 'assistant' -%}
{{- message.content + eos_token -}}
{%- endif -%}
{%- endfor -%})";

// DeepSeek V3 / R1: system text first, then <｜User｜> and <｜Assistant｜> markers.
constexpr const char* kDeepseek = R"({{- bos_token -}}
{%- for message in messages -%}
{%- if message.role == 'system' -%}{{- message.content -}}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
{{- '<｜User｜>' + message.content -}}
{%- elif message.role == 'assistant' -%}
{{- '<｜Assistant｜>' + message.content + '<｜end▁of▁sentence｜>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<｜Assistant｜>' -}}
{%- endif -%})";

const std::pair<const char*, const char*> kBuiltins[] = {
    {"chatml", kChatml},   {"llama3", kLlama3},     {"gemma", kGemma},
    {"mistral", kMistral}, {"deepseek", kDeepseek},
};

}  // namespace

const char* builtin_template_source(const std::string& name) {
  for (const auto& [n, src] : kBuiltins)
    if (name == n) return src;
  return nullptr;
}

std::vector<std::string> builtin_template_names() {
  std::vector<std::string> names;
  for (const auto& b : kBuiltins) names.emplace_back(b.first);
  return names;
}

}  // namespace tandem::chat
