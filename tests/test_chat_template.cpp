// The Jinja-subset interpreter (src/chat/) and ChatTemplate against Python jinja2: the real templates of
// Qwen3, Llama 3.3, Gemma 4, Mistral Nemo and DeepSeek V3.1/R1 over the conversations of
// tests/reference/render_chat_templates.py, whose jinja2 renderings are committed in
// tests/data/chat_templates/expected/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tandem/chat.h"
#include "tokenizer/tokenizer.h"

namespace {

// TANDEM_CHAT_TEMPLATES_DIR points the parity test at another folder written by the script (a sweep over
// more templates).
const std::string kDir = std::getenv("TANDEM_CHAT_TEMPLATES_DIR")
                             ? std::string(std::getenv("TANDEM_CHAT_TEMPLATES_DIR")) + "/"
                             : std::string(TANDEM_SOURCE_DIR) + "/tests/data/chat_templates/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string render(const std::string& src, const std::vector<tandem::ChatMessage>& msgs = {},
                   bool gp = false) {
  return tandem::ChatTemplate::from_source(src, "<s>", "</s>").render(msgs, gp);
}

std::string error_of(const std::string& src) {
  try {
    render(src, {{"user", "hi"}}, true);
  } catch (const tandem::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatTemplate, RealTemplatesMatchJinja2) {
  const auto cases = nlohmann::json::parse(slurp(kDir + "cases.json"));
  int checked = 0;
  for (const auto& [name, tokens] : cases["templates"].items()) {
    std::optional<tandem::ChatTemplate> parsed;
    try {
      parsed = tandem::ChatTemplate::from_source(slurp(kDir + name + ".jinja"), tokens[0], tokens[1]);
    } catch (const tandem::Error& e) {
      ADD_FAILURE() << name << " / (parse): " << e.what();
      continue;
    }
    const tandem::ChatTemplate& tmpl = *parsed;
    for (const auto& [case_name, messages] : cases["cases"].items()) {
      std::vector<tandem::ChatMessage> msgs;
      for (const auto& m : messages) msgs.push_back({m["role"], m["content"]});
      for (int gp = 0; gp < 2; ++gp) {
        const std::string expected =
            slurp(kDir + "expected/" + name + "." + case_name + "." + std::to_string(gp) + ".txt");
        const std::string where = name + " / " + case_name + " / add_generation_prompt=" + std::to_string(gp);
        if (expected.rfind("!error\n", 0) == 0) {
          try {
            tmpl.render(msgs, gp);
            ADD_FAILURE() << where << ": expected the template to raise: " << expected.substr(7);
          } catch (const tandem::Error& e) {
            EXPECT_NE(std::string(e.what()).find(expected.substr(7)), std::string::npos)
                << where << ": " << e.what();
          }
        } else {
          try {
            EXPECT_EQ(tmpl.render(msgs, gp), expected) << where;
          } catch (const tandem::Error& e) {
            ADD_FAILURE() << where << ": " << e.what();
          }
        }
        ++checked;
      }
    }
  }
  if (!std::getenv("TANDEM_CHAT_TEMPLATES_DIR")) {
    EXPECT_EQ(checked, 176);
  }
}

TEST(ChatTemplate, BuiltinsAreTheCheckedFiles) {
  const auto names = tandem::ChatTemplate::builtin_names();
  ASSERT_EQ(names.size(), 5u);
  for (const auto& n : names)
    EXPECT_EQ(tandem::ChatTemplate::builtin(n).source(), slurp(kDir + "builtin-" + n + ".jinja")) << n;
  EXPECT_EQ(tandem::ChatTemplate::builtin("chatml").render({{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ExtraVariablesFromJson) {
  // Qwen3's template with enable_thinking false closes an empty think block after the generation prompt.
  const auto qwen =
      tandem::ChatTemplate::from_source(slurp(kDir + "Qwen-Qwen3-0.6B.jinja"), "", "<|im_end|>");
  EXPECT_EQ(qwen.render({{"user", "Hi"}}, true, R"({"enable_thinking": false})"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(qwen.render({{"user", "Hi"}}, true, "{}"), qwen.render({{"user", "Hi"}}, true));
  const auto t = tandem::ChatTemplate::from_source("{{ tools | tojson }} {{ n + 1 }} {{ bos_token }}", "<s>");
  EXPECT_EQ(t.render({}, false, R"({"tools": [{"name": "f", "x": 1.5, "ok": true, "none": null}], "n": 41})"),
            "[{\"name\": \"f\", \"x\": 1.5, \"ok\": true, \"none\": null}] 42 <s>");
  EXPECT_THROW(t.render({}, false, "[1]"), tandem::Error);
  EXPECT_THROW(t.render({}, false, "{bad"), tandem::Error);
}

TEST(ChatTemplate, UnknownBuiltinNamesTheKnownOnes) {
  try {
    tandem::ChatTemplate::builtin("vicuna");
    FAIL();
  } catch (const tandem::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'vicuna'"), std::string::npos) << m;
    EXPECT_NE(m.find("chatml, llama3, gemma, mistral, deepseek"), std::string::npos) << m;
  }
}

TEST(Jinja, ErrorsNameTheConstructAndPosition) {
  EXPECT_NE(error_of("ab\n  {% include 'x.jinja' %}").find("line 2 col 6: unsupported statement 'include'"),
            std::string::npos)
      << error_of("ab\n  {% include 'x.jinja' %}");
  EXPECT_NE(error_of("{% if false %}{{ x | wordwrap }}{% endif %}")
                .find("line 1 col 20: unsupported filter 'wordwrap'"),
            std::string::npos)
      << error_of("{% if false %}{{ x | wordwrap }}{% endif %}");
  EXPECT_NE(error_of("{{ x is prime }}").find("unsupported test 'prime'"), std::string::npos);
  EXPECT_NE(error_of("{% for m in messages %}").find("expected {% endfor %}"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc }}").find("string literal not closed"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 + }}").find("line 1 col 8"), std::string::npos) << error_of("{{ 1 + }}");
  EXPECT_NE(
      error_of("{{ raise_exception('roles must alternate') }}").find("raise_exception: roles must alternate"),
      std::string::npos);
  EXPECT_NE(error_of("{{ messages[0].role.x.y }}").find("is undefined"), std::string::npos)
      << error_of("{{ messages[0].role.x.y }}");
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand type(s) for +: 'str' and 'int'"),
            std::string::npos);
  EXPECT_NE(error_of("{% set x.y = 1 %}").find("not a namespace()"), std::string::npos);
}

TEST(Jinja, HostileTemplatesAreErrorsNotCrashes) {
  const std::string parens = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  EXPECT_NE(error_of(parens).find("nested too deeply"), std::string::npos) << error_of(parens);
  std::string deep_ifs;
  for (int i = 0; i < 5000; ++i) deep_ifs += "{% if true %}";
  EXPECT_NE(error_of(deep_ifs).find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion too deep"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 1 // 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc'[::0] }}").find("slice step cannot be zero"), std::string::npos);
  EXPECT_NE(error_of("{% for x in 5 %}{% endfor %}").find("'int' object is not iterable"), std::string::npos);
}

// A template that overflows an integer, builds a string or list without bound, or loops for hours stops with
// an Error (a template is untrusted: it comes from the GGUF). Before the limits: undefined behaviour (UBSan
// reports in fuzz_chat_template), a 10^18-iteration loop, memory exhausted.
TEST(Jinja, RunawayTemplatesAreErrorsNotHangs) {
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow in '+'"), std::string::npos);
  EXPECT_NE(error_of("{{ -9223372036854775807 - 2 }}").find("integer overflow in '-'"), std::string::npos);
  EXPECT_NE(error_of("{{ 4294967296 * 4294967296 }}").find("integer overflow in '*'"), std::string::npos);
  EXPECT_NE(error_of("{{ 2 ** 64 }}").find("integer overflow in '**'"), std::string::npos);
  EXPECT_NE(error_of("{{ 3 ** 1000000000000000000 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1) // -1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ -(-9223372036854775807 - 1) }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 'ab' * 1000000000000 }}").find("string of more than 64 MiB"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='abcdefgh') %}{% for i in range(40) %}{% set ns.s = ns.s + "
                     "ns.s %}{% endfor %}")
                .find("string of more than"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
                     "{% endfor %}")
                .find("list of more than"),
            std::string::npos);
  EXPECT_NE(error_of("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")
                .find("runs too long"),
            std::string::npos);
  // a long real conversation stays far inside the limits
  std::vector<tandem::ChatMessage> long_chat;
  for (int i = 0; i < 2000; ++i)
    long_chat.push_back({i % 2 ? "assistant" : "user", "message number " + std::to_string(i)});
  for (const char* name :
       {"google-gemma-4-31B-it.jinja", "Qwen-Qwen3-0.6B.jinja", "deepseek-ai-DeepSeek-V3.1.jinja"})
    EXPECT_NO_THROW(
        tandem::ChatTemplate::from_source(slurp(kDir + name), "<s>", "</s>").render(long_chat, true))
        << name;
  // what stays within the limits still works, Python's way
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 'ab' * 3 }} {{ 'x' * -1 }}|{{ 7 // -2 }} {{ -7 % 3 }}"),
            "4611686018427387904 -9223372036854775808 ababab |-4 2");
}
TEST(ChatTemplate, RenderedMarkupTokenizesAsSpecialTokens) {
  // The spm-1k fixture vocabulary has <|im_start|> as a control token: the rendered chatml prompt, tokenized
  // as chat uses it (parse_special), holds it as one token per message, not as its characters.
  const auto tok = tandem::tokenizer::Tokenizer::from_gguf(
      tandem::gguf::GgufFile::open(std::string(TANDEM_SOURCE_DIR) + "/tests/data/tokenizer/spm-1k.gguf"));
  const int32_t im_start = tok.find_token("<|im_start|>");
  ASSERT_GE(im_start, 0);
  const std::string text =
      tandem::ChatTemplate::builtin("chatml").render({{"system", "Be brief."}, {"user", "hi"}}, true);
  const auto ids = tok.encode(text, false, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 3);
}

TEST(Jinja, WhitespaceControlAsHuggingFace) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before a block tag goes.
  EXPECT_EQ(render("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif %} z"), "xy z");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");  // expressions keep their newline
  EXPECT_EQ(render("  {# c #}\nq"), "q");
  EXPECT_EQ(render("a {%+ if true %}b{% endif %}"), "a b");
}

TEST(Jinja, LoopsConditionalsAndScopes) {
  EXPECT_EQ(
      render("{% for x in [3,4,5] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
             "{{ loop.last }}{{ loop.length }};{% endfor %}"),
      "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}"),
            "2242");
  EXPECT_EQ(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% elif x > 4 %}{% break %}{% endif "
                   "%}{{ x }}{% endfor %}"),
            "0134");
  // set in a loop body does not leak; a namespace carries values out
  EXPECT_EQ(
      render("{% set a = 1 %}{% set ns = namespace(b=1) %}{% for x in [5] %}{% set a = x %}{% set ns.b = x %}"
             "{% endfor %}{{ a }} {{ ns.b }}"),
      "1 5");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }} {% endfor %}"), "a=1 b=[2] ");
  EXPECT_EQ(render("{{ 'y' if 0 else 'n' }}{{ 'z' if false }}|{{ none }}{{ undefined_thing }}"), "n|None");
}

TEST(Jinja, ExpressionsFiltersAndTests) {
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }} {{ [1,2,3][::-1] }} {{ 'héllo'[-4:] }} {{ [1,2,3][-1] }}"),
            "bcd [3, 2, 1] éllo 3");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 ~ 'x' "
                   "~ none }}"),
            "3 -4 1 2 3.5 1024 1xNone");
  EXPECT_EQ(render("{{ 'a' in 'cat' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [3] }}"),
            "True True True False");
  EXPECT_EQ(
      render("{{ '  x  ' | trim }}|{{ [1,2] | length }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|"
             "{{ missing | default('d') }}|{{ ['a','b'] | join(', ') }}|{{ 'aXbX' | replace('X', '-') }}"),
      "x|2|ABab|d|a, b|a-b-");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [true, none, 1.5, 'é\"']} | tojson }}"),
            "{\"b\": 1, \"a\": [true, null, 1.5, \"é\\\"\"]}");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{% for k, v in {'b': 2, 'a': 1} | dictsort %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(
      render("{{ [{'r': 'u'}, {'r': 'a'}, {'r': 'u'}] | selectattr('r', 'equalto', 'u') | list | length }}"
             "{{ ['a', 'b'] | map('upper') | join }}{{ [{'n': 1}] | map(attribute='n') | first }}"
             "{{ [1, 2, 3] | reject('odd') | list }}{{ [1,2] | last }}{{ 5 | string }}{{ '12' | int + 1 }}"),
      "2AB1[2]2513");
  EXPECT_EQ(
      render("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}"
             "{{ 3 is odd }}{{ 1 is number }}{{ 'a' is not string }}{{ true is boolean }}{{ 4 is divisibleby "
             "2 }}"),
      "FalseTrueTrueTrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ 'x</t>y'.split('</t>')[-1] }}|"
                   "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}|{{ '\\nq\\n'.lstrip('\\n') }}|"
                   "{{ {'a': 1}.get('b', 7) }}{{ {'a': 1}.get('a') }}"),
            "a b|['a', 'b', '', 'c']|y|TrueTrue|q\n|71");
  EXPECT_EQ(
      render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Al') }} "
             "{{ greet('Bo', punct='?') }}"),
      "Hi Al! Hi Bo?");
  EXPECT_EQ(render("{% set s %}a{{ 1 + 1 }}{% endset %}{{ s }}"), "a2");
  EXPECT_EQ(render("{{ '<{}|{}>'.format('a', 2) }}{{ none | selectattr('x') | list }}{{ none | map('upper') "
                   "| list }}"),
            "<a|2>[][]");
  EXPECT_EQ(render("{{ messages[0]['role'] }}:{{ messages[0].content }} {{ bos_token }}{{ eos_token }}",
                   {{"user", "hé"}}),
            "user:hé <s></s>");
}

}  // namespace
