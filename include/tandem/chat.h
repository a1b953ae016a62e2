// Chat templates: a conversation (ChatMessage list) rendered into the prompt text a chat model was trained
// on.
//
//   tandem::ChatTemplate tmpl = tandem::ChatTemplate::from_model(*model);        // GGUF
//   tokenizer.chat_template tandem::ChatTemplate tmpl = tandem::ChatTemplate::from_model(*model, "chatml");
//   // --chat-template NAME std::string prompt = tmpl.render({{"system", "Be brief."}, {"user", "Hi"}},
//   /*add_generation_prompt=*/true);
//
// Templates are Jinja; we render them with our own Jinja-subset interpreter (src/chat/), configured as
// transformers' apply_chat_template configures jinja2: trim_blocks and lstrip_blocks on, `raise_exception`,
// `strftime_now`, the `tojson` filter, and the variables `messages`, `add_generation_prompt`, `bos_token`,
// `eos_token`. An unsupported construct, a syntax error or a template's raise_exception throws tandem::Error
// with the line and column.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tandem {

class Model;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" (templates decide what they accept)
  std::string content;  // plain text
};

class ChatTemplate {
 public:
  // The model's template: override_name when not empty (a built-in name, see builtin(); or a path to a
  // .jinja file), else the GGUF's tokenizer.chat_template. Throws Error when the model has none and no
  // override is given (the message names --chat-template and the built-in names), or when it does not parse.
  // bos_token/eos_token come from the model's tokenizer when it has one.
  static ChatTemplate from_model(const Model& model, const std::string& override_name = "");
  // A built-in template by name; throws Error naming the known names for an unknown one.
  static ChatTemplate builtin(const std::string& name);
  // "chatml", "llama3", "gemma", "mistral", "deepseek", ...
  static std::vector<std::string> builtin_names();
  // Parses Jinja source (throws Error with line:column on a syntax error or an unsupported construct).
  static ChatTemplate from_source(const std::string& source, std::string bos_token = "",
                                  std::string eos_token = "");

  ChatTemplate(const ChatTemplate&);
  ChatTemplate& operator=(const ChatTemplate&);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // The prompt text for messages; with add_generation_prompt the text ends with the assistant turn's opening,
  // ready for the model to answer. Throws Error on a template error (raise_exception, a bad value).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // The same with more template variables: extra_json is a JSON object whose members become variables
  // ({"enable_thinking": false, "tools": [...]}; bos_token/eos_token override the model's); messages and
  // add_generation_prompt stay those given. Throws Error for text that is not a JSON object.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& extra_json) const;

  const std::string& source() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tandem
