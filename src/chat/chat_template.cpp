// tandem::ChatTemplate (include/tandem/chat.h) over the Jinja-subset interpreter.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "chat/builtin_templates.h"
#include "chat/jinja_eval.h"
#include "chat/jinja_parser.h"
#include "core/error.h"
#include "core/file_io.h"
#include "model/model_impl.h"
#include "tandem/chat.h"
#include "tandem/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

struct ChatTemplate::Impl {
  std::string source, bos, eos;
  chat::Body body;
};

ChatTemplate::ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(const ChatTemplate&) = default;
ChatTemplate& ChatTemplate::operator=(const ChatTemplate&) = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::from_source(const std::string& source, std::string bos_token,
                                       std::string eos_token) {
  auto impl = std::make_shared<Impl>();
  impl->source = source;
  impl->bos = std::move(bos_token);
  impl->eos = std::move(eos_token);
  impl->body = chat::parse_template(source);
  chat::check_supported(impl->body);
  return ChatTemplate(std::move(impl));
}

static std::string names_list() {
  std::string s;
  for (const auto& n : chat::builtin_template_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

ChatTemplate ChatTemplate::builtin(const std::string& name) {
  const char* src = chat::builtin_template_source(name);
  if (!src) throw Error("--chat-template: unknown template '" + name + "' (built-in: " + names_list() + ")");
  return from_source(src);
}

std::vector<std::string> ChatTemplate::builtin_names() {
  return chat::builtin_template_names();
}

ChatTemplate ChatTemplate::from_model(const Model& model, const std::string& override_name) {
  std::string bos, eos;
  if (model.has_tokenizer()) {
    const tokenizer::Tokenizer& tok = model.tokenizer();
    if (tok.bos() >= 0) bos = tok.token_text(tok.bos());
    if (tok.eos() >= 0) eos = tok.token_text(tok.eos());
  }
  std::string source;
  if (!override_name.empty()) {
    if (const char* src = chat::builtin_template_source(override_name)) {
      source = src;
    } else if (std::filesystem::exists(override_name)) {
      source = read_regular_file(override_name, "--chat-template");
    } else {
      throw Error("--chat-template: '" + override_name + "' is neither a built-in template (" + names_list() +
                  ") nor a file");
    }
  } else {
    const gguf::GgufFile& file = *model.impl().file;
    if (!file.find("tokenizer.chat_template"))
      throw Error(model.info().path +
                  " has no tokenizer.chat_template; choose one with --chat-template NAME (" + names_list() +
                  ") or a .jinja file");
    source = file.get_string("tokenizer.chat_template");
  }
  try {
    return from_source(source, bos, eos);
  } catch (const Error& e) {
    throw Error(std::string("chat template of ") +
                (override_name.empty() ? model.info().path : "'" + override_name + "'") + ": " + e.what());
  }
}

namespace {

chat::Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return chat::Value::none();
    case nlohmann::json::value_t::boolean:
      return chat::Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return chat::Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_float:
      return chat::Value(j.get<double>());
    case nlohmann::json::value_t::string:
      return chat::Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      chat::List l;
      for (const auto& x : j) l.push_back(from_json(x));
      return chat::Value(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      chat::Dict d;
      for (const auto& [k, x] : j.items()) d.emplace_back(k, from_json(x));
      return chat::Value(std::move(d));
    }
    default:
      throw Error("chat template variables: unsupported JSON value");
  }
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& extra_json) const {
  nlohmann::ordered_json extra;
  try {
    extra = nlohmann::ordered_json::parse(extra_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("chat template variables: bad JSON: ") + e.what());
  }
  check(extra.is_object(), "chat template variables: expected a JSON object");
  chat::Dict vars;
  for (const auto& [k, x] : extra.items())
    if (k != "messages" && k != "add_generation_prompt") vars.emplace_back(k, from_json(x));
  chat::List msgs;
  for (const auto& m : messages)
    msgs.emplace_back(chat::Dict{{"role", chat::Value(m.role)}, {"content", chat::Value(m.content)}});
  vars.emplace_back("messages", chat::Value(std::move(msgs)));
  vars.emplace_back("add_generation_prompt", chat::Value(add_generation_prompt));
  // bos_token / eos_token unless the extra variables give them
  const auto given = [&](const char* k) {
    for (const auto& kv : vars)
      if (kv.first == k) return true;
    return false;
  };
  if (!given("bos_token")) vars.emplace_back("bos_token", chat::Value(impl_->bos));
  if (!given("eos_token")) vars.emplace_back("eos_token", chat::Value(impl_->eos));
  return chat::render_template(impl_->body, vars);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  return render(messages, add_generation_prompt, "{}");
}

const std::string& ChatTemplate::source() const {
  return impl_->source;
}
const std::string& ChatTemplate::bos_token() const {
  return impl_->bos;
}
const std::string& ChatTemplate::eos_token() const {
  return impl_->eos;
}

}  // namespace tandem
