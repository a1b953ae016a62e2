// libFuzzer harness for chat templates (the Jinja-subset interpreter of src/chat/): a template is untrusted
// bytes, read from a GGUF's tokenizer.chat_template or a --chat-template file. The bytes up to the first NUL
// are the template source; the bytes after it, when present, are the extra variables as JSON (what `chat
// --chat-template-kwargs` and the server's chat_template_kwargs pass). The template is parsed and rendered
// over a small conversation; it must render or throw tandem::Error. A crash, a sanitizer report, another
// exception, or a render that runs away (libFuzzer's -timeout / -rss_limit_mb) is a finding.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "core/error.h"
#include "tandem/chat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const size_t nul = bytes.find('\0');
  const std::string source = bytes.substr(0, nul);
  static const std::vector<tandem::ChatMessage> messages = {{"system", "Be brief."},
                                                            {"user", "Hi <think>x</think> \xc3\xa9"},
                                                            {"assistant", "Hello."},
                                                            {"user", "Again?"}};
  try {
    const tandem::ChatTemplate t = tandem::ChatTemplate::from_source(source, "<s>", "</s>");
    if (nul == std::string::npos) {
      (void)t.render(messages, true);
      (void)t.render(messages, false);
    } else {
      (void)t.render(messages, true, bytes.substr(nul + 1));
    }
  } catch (const tandem::Error&) {
  }
  return 0;
}
