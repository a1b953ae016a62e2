// Hugging Face tokenizer.json -> tokenizer.ggml.* keys (llama.cpp conventions).
//
// Three kinds are written:
//   - "gpt2":   byte-level BPE (a ByteLevel pre-tokenizer or decoder). Merges as "a b" strings, ranked as
//   stored.
//   - "llama":  SentencePiece-style (BPE with byte_fallback / Metaspace / a "▁" normalizer, or Unigram).
//   Scores
//               are written for llama.cpp's score-ordered merge; for a BPE model the merges are written too,
//               so that tandem can reproduce the exact rank order HF uses (llama.cpp ignores merges for this
//               model).
//   - "gemma4": SentencePiece-style BPE of Gemma 4 (chosen from the architecture, see GGUF-ARCH-FACTS C.1).
//
// tokenizer.ggml.pre: llama.cpp chooses it by hashing the tokens its converter gets for a fixed probe text.
// We do not have that tokenizer here, so we choose it by comparing the pre-tokenizer steps of tokenizer.json
// (Split regexes, Digits, ByteLevel) with the known patterns of each pre type. An unknown pattern gets pre =
// "default" plus tokenizer.tandem.pre_regexes (the regexes, in order), which tandem's tokenizer honours.
#include "convert/tokenizer_to_gguf.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "tokenizer/pre_patterns.h"

namespace tandem::convert {
namespace {

// Real tokenizer.json files nest a few levels; a deeper one is refused rather than recursed into.
constexpr int kMaxJsonNesting = 64;

using nlohmann::json;
namespace fs = std::filesystem;

// llama.cpp token types.
enum TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

// The deepest nesting of arrays/objects, without recursion (the walks below recurse, bounded by this).
int nesting_depth(const json& root) {
  int deepest = 0;
  std::vector<std::pair<const json*, int>> todo{{&root, 0}};
  while (!todo.empty()) {
    const auto [j, depth] = todo.back();
    todo.pop_back();
    deepest = std::max(deepest, depth);
    if (depth > kMaxJsonNesting) break;
    if (j->is_structured()) {
      for (const auto& child : *j) todo.emplace_back(&child, depth + 1);
    }
  }
  return deepest;
}

std::optional<json> read_json(const fs::path& path, bool required) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    check(!required,
          path.string() + ": cannot open (a Hugging Face tokenizer.json is needed for the vocabulary)");
    return std::nullopt;
  }
  const std::string text = read_regular_file(path.string(), "the checkpoint's");  // FIFO, directory: errors
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": not valid JSON: " + e.what());
  }
  check(nesting_depth(j) <= kMaxJsonNesting, path.string() + ": JSON nested more than " +
                                                 std::to_string(kMaxJsonNesting) + " levels deep");
  return j;
}

std::string read_text(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  return read_regular_file(path.string(), "the checkpoint's");
}

// A special token in tokenizer_config.json is either a string or {"content": "..."}.
std::optional<std::string> token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return std::nullopt;
}

// Flattens a pre-tokenizer (possibly a Sequence) into the steps tandem compares with known patterns.
void collect_pre_steps(const json& pt, std::vector<std::string>& steps, bool& byte_level, bool& metaspace,
                       std::string& unsupported, int depth = 0) {
  if (pt.is_null()) return;
  check(depth < kMaxJsonNesting, "pre_tokenizer Sequences nested more than " +
                                     std::to_string(kMaxJsonNesting) + " deep");
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    // By reference: value() would copy the whole subtree at every level (quadratic in the nesting depth).
    const auto it = pt.find("pretokenizers");
    if (it != pt.end() && it->is_array()) {
      for (const auto& p : *it) collect_pre_steps(p, steps, byte_level, metaspace, unsupported, depth + 1);
    }
  } else if (type == "Split") {
    const json& pat = pt.value("pattern", json::object());
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat["Regex"].get<std::string>();
    } else if (pat.contains("String")) {
      // A literal: escape it so it can be used as a regex.
      for (char c : pat["String"].get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) regex += '\\';
        regex += c;
      }
    }
    const std::string behavior = pt.value("behavior", "Isolated");
    if (behavior != "Isolated" || pt.value("invert", false)) {
      unsupported = "Split with behavior " + behavior + (pt.value("invert", false) ? " (inverted)" : "");
    }
    steps.push_back(regex);
  } else if (type == "Digits") {
    steps.push_back(pt.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else if (type == "Punctuation") {
    steps.push_back(tokenizer::kFalconPunctPattern);
  } else if (type == "ByteLevel") {
    byte_level = true;
    if (pt.value("use_regex", true)) steps.push_back(tokenizer::kGpt2Pattern);
  } else if (type == "Metaspace") {
    metaspace = true;
  } else if (type == "WhitespaceSplit" || type == "Whitespace" || type == "BertPreTokenizer") {
    unsupported = "pre-tokenizer " + type;
  }
}

bool json_has_type(const json& j, const std::string& type, int depth = 0) {
  check(depth < kMaxJsonNesting, "JSON nested more than " + std::to_string(kMaxJsonNesting) + " deep");
  if (j.is_object()) {
    const auto t = j.find("type");
    if (t != j.end() && t->is_string() && t->get_ref<const std::string&>() == type) return true;
    for (const auto& [k, v] : j.items()) {
      if (json_has_type(v, type, depth + 1)) return true;
    }
  } else if (j.is_array()) {
    for (const auto& v : j) {
      if (json_has_type(v, type, depth + 1)) return true;
    }
  }
  return false;
}

// Does the normalizer prepend "▁" (Llama-2 style) or does a Metaspace add a prefix space? (HF's Metaspace leaves
// the prefix out when the text already starts with a space; SentencePiece and llama.cpp always add it, and so
// does tandem, so a Metaspace tokenizer.json can differ from tandem on text that starts with a space.)
bool has_space_prefix(const json& tj) {
  bool prefix = false;
  std::function<void(const json&)> walk = [&](const json& j) {
    if (j.is_object()) {
      const std::string type = j.value("type", "");
      if (type == "Prepend" && j.value("prepend", "") == "\u2581") prefix = true;
      if (type == "Metaspace") {
        if (j.contains("prepend_scheme")) {
          if (j["prepend_scheme"] != "never") prefix = true;
        } else if (j.value("add_prefix_space", true)) {
          prefix = true;
        }
      }
      for (const auto& [k, v] : j.items()) walk(v);
    } else if (j.is_array()) {
      for (const auto& v : j) walk(v);
    }
  };
  walk(tj.value("normalizer", json()));
  walk(tj.value("pre_tokenizer", json()));
  return prefix;
}

bool is_byte_token(const std::string& s) {
  if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return false;
  return std::isxdigit(static_cast<unsigned char>(s[3])) && std::isxdigit(static_cast<unsigned char>(s[4]));
}

std::string architecture_of(const gguf::GgufWriter& w, const fs::path& hf_dir) {
  for (const auto& [k, v] : w.metadata()) {
    if (k == "general.architecture" && v.type() == gguf::ValueType::STRING) return v.as_string();
  }
  if (auto cfg = read_json(hf_dir / "config.json", false); cfg && cfg->is_object()) {
    return cfg->value("model_type", "");
  }
  return "";
}

}  // namespace

namespace {

void add_tokenizer_metadata_unchecked(const fs::path& hf_dir, gguf::GgufWriter& w);

}  // namespace

// A tokenizer.json of the wrong shape (a string where an object belongs, ...) makes the JSON library throw
// from deep inside the reading code: every such case becomes one Error naming the file.
void add_tokenizer_metadata(const fs::path& hf_dir, gguf::GgufWriter& w) {
  try {
    add_tokenizer_metadata_unchecked(hf_dir, w);
  } catch (const json::exception& e) {
    throw Error((hf_dir / "tokenizer.json").string() + " (or tokenizer_config.json): unexpected JSON shape: " +
                e.what());
  }
}

namespace {

void add_tokenizer_metadata_unchecked(const fs::path& hf_dir, gguf::GgufWriter& w) {
  const fs::path tok_path = hf_dir / "tokenizer.json";
  json tj = *read_json(tok_path, true);
  const std::string where = tok_path.string();
  check(tj.is_object() && tj.contains("model") && tj["model"].is_object(),
        where + ": no \"model\" object (is this a Hugging Face tokenizer.json?)");
  const json& model = tj["model"];
  std::string model_type = model.value("type", "");
  if (model_type.empty()) {
    if (model.contains("merges"))
      model_type = "BPE";
    else if (model.contains("vocab") && model["vocab"].is_array())
      model_type = "Unigram";
  }
  check(model_type == "BPE" || model_type == "Unigram",
        where + ": tokenizer model type \"" + model_type +
            "\" is not supported (tandem supports byte-level BPE, SentencePiece-style BPE and Unigram)");

  // ---- vocabulary: id -> text, with added tokens on top ----
  std::map<int64_t, std::string> id_to_text;
  std::vector<float> unigram_scores;
  try {
    if (model_type == "BPE") {
      check(model.contains("vocab") && model["vocab"].is_object(),
            where + ": BPE model without a vocab object");
      for (const auto& [text, id] : model["vocab"].items()) {
        check(id.is_number_integer() && id.get<int64_t>() >= 0,
              where + ": vocab entry \"" + text + "\" has a bad id");
        auto [it, inserted] = id_to_text.emplace(id.get<int64_t>(), text);
        check(inserted, where + ": vocab entries \"" + it->second + "\" and \"" + text +
                            "\" have the same id " + std::to_string(it->first));
      }
    } else {
      const json& vocab = model["vocab"];
      check(vocab.is_array(), where + ": Unigram model without a vocab array");
      for (size_t i = 0; i < vocab.size(); ++i) {
        check(
            vocab[i].is_array() && vocab[i].size() == 2 && vocab[i][0].is_string() && vocab[i][1].is_number(),
            where + ": Unigram vocab entry " + std::to_string(i) + " is not [piece, score]");
        id_to_text[static_cast<int64_t>(i)] = vocab[i][0].get<std::string>();
        unigram_scores.push_back(vocab[i][1].get<float>());
      }
    }
  } catch (const json::exception& e) {
    throw Error(where + ": malformed vocab: " + e.what());
  }
  std::unordered_map<int64_t, bool> added_special;  // id -> special?
  for (const auto& at : tj.value("added_tokens", json::array())) {
    check(at.is_object() && at.contains("id") && at["id"].is_number_integer() && at.contains("content") &&
              at["content"].is_string(),
          where + ": malformed entry in added_tokens");
    const int64_t id = at["id"].get<int64_t>();
    check(id >= 0, where + ": added token with negative id");
    id_to_text[id] = at["content"].get<std::string>();
    added_special[id] = at.value("special", false);
  }
  check(!id_to_text.empty(), where + ": the vocabulary is empty");
  const int64_t n_vocab = id_to_text.rbegin()->first + 1;
  check(n_vocab - static_cast<int64_t>(id_to_text.size()) <= (int64_t{1} << 20),
        where + ": token ids leave a gap of more than 2^20 unused ids (max id " +
            std::to_string(n_vocab - 1) + ")");
  std::unordered_map<std::string, int64_t> text_to_id;
  for (const auto& [id, text] : id_to_text) text_to_id.emplace(text, id);

  // ---- kind ----
  std::vector<std::string> pre_steps;
  bool byte_level = false, metaspace = false;
  std::string unsupported;
  collect_pre_steps(tj.value("pre_tokenizer", json()), pre_steps, byte_level, metaspace, unsupported);
  if (!byte_level && json_has_type(tj.value("decoder", json()), "ByteLevel")) byte_level = true;
  const std::string arch = architecture_of(w, hf_dir);
  // gemma4 files always get Gemma 4's SentencePiece-style kind (facts C.1). A diffusion-gemma checkpoint with a
  // byte-level BPE vocabulary (tandem's shipped canvas model uses the small models' vocabulary) stays
  // byte-level: labelled gemma4 it would detokenize to raw byte-level symbols.
  const bool diffusion_arch = arch == "diffusion-gemma" || arch == "diffusion_gemma";
  const bool gemma4 = arch.rfind("gemma4", 0) == 0 || (diffusion_arch && !byte_level);

  std::string ggml_model;
  if (gemma4) {
    ggml_model = "gemma4";
  } else if (byte_level) {
    check(model_type == "BPE", where + ": a byte-level Unigram tokenizer is not supported");
    ggml_model = "gpt2";
  } else {
    const bool spm_like = model_type == "Unigram" || model.value("byte_fallback", false) || metaspace ||
                          json_has_type(tj.value("normalizer", json()), "Replace") ||
                          json_has_type(tj.value("decoder", json()), "ByteFallback");
    check(spm_like,
          where +
              ": a BPE tokenizer without ByteLevel or SentencePiece-style (byte_fallback, Metaspace, "
              "\"▁\" normalizer) handling is not supported");
    ggml_model = "llama";
  }
  if (ggml_model == "gpt2") check(unsupported.empty(), where + ": " + unsupported + " is not supported");

  // ---- tokens and types ----
  std::optional<std::string> unk_text;
  if (model.contains("unk_token") && model["unk_token"].is_string())
    unk_text = model["unk_token"].get<std::string>();
  std::vector<std::string> tokens(static_cast<size_t>(n_vocab));
  std::vector<int32_t> types(static_cast<size_t>(n_vocab), kUnused);
  for (int64_t id = 0; id < n_vocab; ++id) {
    auto it = id_to_text.find(id);
    if (it == id_to_text.end()) {
      tokens[id] = "[PAD" + std::to_string(id) + "]";
      continue;
    }
    tokens[id] = it->second;
    if (auto a = added_special.find(id); a != added_special.end()) {
      types[id] = a->second ? kControl : kUserDefined;
    } else if (unk_text && it->second == *unk_text) {
      types[id] = kUnknown;
    } else if (ggml_model != "gpt2" && is_byte_token(it->second)) {
      types[id] = kByte;
    } else {
      types[id] = kNormal;
    }
    if (unk_text && it->second == *unk_text) types[id] = kUnknown;
  }

  // ---- merges ----
  std::vector<std::string> merges;
  if (model_type == "BPE" && model.contains("merges")) {
    const json& jm = model["merges"];
    check(jm.is_array(), where + ": model.merges is not an array");
    merges.reserve(jm.size());
    for (size_t i = 0; i < jm.size(); ++i) {
      const json& m = jm[i];
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ', 1);
        check(sp != std::string::npos && sp + 1 < s.size(),
              where + ": merge " + std::to_string(i) + " (\"" + s + "\") is not \"left right\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        throw Error(where + ": merge " + std::to_string(i) + " is neither \"left right\" nor [left, right]");
      }
      check(text_to_id.count(a) && text_to_id.count(b) && text_to_id.count(a + b),
            where + ": merge " + std::to_string(i) + " (\"" + a + "\" + \"" + b +
                "\") uses a token that is not in the vocabulary");
      merges.push_back(a + " " + b);
    }
  }

  // ---- scores (SentencePiece-style): Unigram log-probs, or minus the rank of the merge that makes a token
  // ----
  std::vector<float> scores;
  if (ggml_model != "gpt2") {
    scores.assign(static_cast<size_t>(n_vocab), 0.0f);
    if (model_type == "Unigram") {
      for (size_t i = 0; i < unigram_scores.size(); ++i) scores[i] = unigram_scores[i];
    } else {
      std::vector<bool> seen(static_cast<size_t>(n_vocab), false);
      for (size_t r = 0; r < merges.size(); ++r) {
        const size_t sp = merges[r].find(' ', 1);
        std::string joined = merges[r].substr(0, sp) + merges[r].substr(sp + 1);
        const int64_t id = text_to_id[joined];
        if (!seen[id]) {
          seen[id] = true;
          scores[id] = -static_cast<float>(r + 1);
        }
      }
    }
    for (int64_t id = 0; id < n_vocab; ++id) {
      if (types[id] == kControl || types[id] == kUnused) scores[id] = -1000.0f;
    }
  }

  w.set("tokenizer.ggml.model", gguf::Value::string(ggml_model));
  if (ggml_model == "gpt2") {
    const std::string pre = tokenizer::match_pre_type(pre_steps);
    if (pre.empty()) {
      w.set("tokenizer.ggml.pre", gguf::Value::string("default"));
      w.set("tokenizer.tandem.pre_regexes", gguf::Value::string_array(pre_steps));
    } else {
      w.set("tokenizer.ggml.pre", gguf::Value::string(pre));
    }
  } else if (ggml_model == "gemma4") {
    w.set("tokenizer.ggml.pre", gguf::Value::string("gemma4"));
  } else {
    w.set("tokenizer.ggml.pre", gguf::Value::string("default"));
  }
  w.set("tokenizer.ggml.tokens", gguf::Value::string_array(tokens));
  if (!scores.empty()) w.set("tokenizer.ggml.scores", gguf::Value::f32_array(scores));
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
  if (model_type == "BPE") w.set("tokenizer.ggml.merges", gguf::Value::string_array(merges));
  if (model_type == "BPE") {
    w.set("tokenizer.ggml.ignore_merges", gguf::Value::boolean(model.value("ignore_merges", false)));
  }

  // ---- special tokens ----
  auto cfg = read_json(hf_dir / "tokenizer_config.json", false);
  auto gen = read_json(hf_dir / "generation_config.json", false);
  auto model_cfg = read_json(hf_dir / "config.json", false);
  auto id_of = [&](const std::string& text) -> std::optional<int64_t> {
    auto it = text_to_id.find(text);
    if (it == text_to_id.end()) return std::nullopt;
    return it->second;
  };
  auto id_from_config_ids = [&](const char* key) -> std::optional<int64_t> {
    for (const auto* src : {&gen, &model_cfg}) {
      if (!*src || !(*src)->is_object() || !(*src)->contains(key)) continue;
      json v = (**src)[key];
      if (v.is_array() && !v.empty()) v = v[0];
      if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < n_vocab)
        return v.get<int64_t>();
    }
    return std::nullopt;
  };
  // The post-processor template: special tokens before the sequence are BOS, after it EOS.
  std::optional<std::string> template_bos, template_eos;
  const json post = tj.value("post_processor", json());
  std::function<const json*(const json&, int)> find_template = [&](const json& p, int depth) -> const json* {
    if (!p.is_object()) return nullptr;
    check(depth < kMaxJsonNesting, where + ": post_processor Sequences nested more than " +
                                       std::to_string(kMaxJsonNesting) + " deep");
    if (p.value("type", "") == "TemplateProcessing") return &p;
    if (p.value("type", "") == "Sequence") {
      const auto it = p.find("processors");  // by reference, as in collect_pre_steps
      if (it == p.end() || !it->is_array()) return nullptr;
      for (const auto& q : *it) {
        if (const json* t = find_template(q, depth + 1)) return t;
      }
    }
    return nullptr;
  };
  if (const json* tp = find_template(post, 0); tp && tp->contains("single") && (*tp)["single"].is_array()) {
    bool before = true;
    for (const auto& piece : (*tp)["single"]) {
      if (piece.contains("Sequence")) {
        before = false;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                 piece["SpecialToken"]["id"].is_string()) {
        const std::string text = piece["SpecialToken"]["id"].get<std::string>();
        if (before && !template_bos) template_bos = text;
        if (!before && !template_eos) template_eos = text;
      }
    }
  }
  struct SpecialKey {
    const char* config_key;
    const char* gguf_key;
  };
  const SpecialKey special_keys[] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                     {"eos_token", "tokenizer.ggml.eos_token_id"},
                                     {"unk_token", "tokenizer.ggml.unknown_token_id"},
                                     {"pad_token", "tokenizer.ggml.padding_token_id"},
                                     {"mask_token", "tokenizer.ggml.mask_token_id"}};
  for (const auto& sk : special_keys) {
    std::optional<int64_t> id;
    if (cfg && cfg->is_object() && cfg->contains(sk.config_key)) {
      if (auto text = token_content((*cfg)[sk.config_key])) id = id_of(*text);
    }
    if (!id) {
      const std::string ids_key = std::string(sk.config_key) + "_id";
      id = id_from_config_ids(ids_key.c_str());
    }
    if (!id && std::string(sk.config_key) == "unk_token" && unk_text) id = id_of(*unk_text);
    if (!id && std::string(sk.config_key) == "bos_token" && template_bos) id = id_of(*template_bos);
    if (!id && std::string(sk.config_key) == "eos_token" && template_eos) id = id_of(*template_eos);
    if (id) w.set(sk.gguf_key, gguf::Value::u32(static_cast<uint32_t>(*id)));
  }

  // add_bos / add_eos: tokenizer_config.json, else what the post-processor template adds around the sequence.
  std::optional<bool> add_bos, add_eos;
  if (cfg && cfg->is_object()) {
    if (cfg->contains("add_bos_token") && (*cfg)["add_bos_token"].is_boolean())
      add_bos = (*cfg)["add_bos_token"].get<bool>();
    if (cfg->contains("add_eos_token") && (*cfg)["add_eos_token"].is_boolean())
      add_eos = (*cfg)["add_eos_token"].get<bool>();
  }
  if (!add_bos) add_bos = template_bos.has_value();
  if (!add_eos) add_eos = template_eos.has_value();
  if (gemma4) add_bos = true;
  w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos.value_or(false)));
  w.set("tokenizer.ggml.add_eos_token", gguf::Value::boolean(add_eos.value_or(false)));
  if (ggml_model == "llama") {
    w.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(has_space_prefix(tj)));
  } else if (ggml_model == "gemma4") {
    w.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(false));
  } else {
    bool prefix = false;
    std::function<void(const json&)> walk = [&](const json& j) {
      if (!j.is_object()) return;
      if (j.value("type", "") == "ByteLevel" && j.value("add_prefix_space", false)) prefix = true;
      for (const auto& p : j.value("pretokenizers", json::array())) walk(p);
    };
    walk(tj.value("pre_tokenizer", json()));
    if (prefix) w.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(true));
  }

  // ---- chat template: chat_template.jinja, else tokenizer_config.json ----
  std::string tmpl = read_text(hf_dir / "chat_template.jinja");
  if (tmpl.empty() && cfg && cfg->is_object() && cfg->contains("chat_template")) {
    const json& ct = (*cfg)["chat_template"];
    if (ct.is_string()) {
      tmpl = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (const auto& t : ct) {
        if (!t.is_object() || !t.contains("name") || !t.contains("template") || !t["template"].is_string())
          continue;
        const std::string name = t["name"].is_string() ? t["name"].get<std::string>() : "";
        if (name == "default") {
          tmpl = t["template"].get<std::string>();
        } else if (!name.empty()) {
          w.set("tokenizer.chat_template." + name, gguf::Value::string(t["template"].get<std::string>()));
        }
      }
    }
  }
  if (!tmpl.empty()) w.set("tokenizer.chat_template", gguf::Value::string(tmpl));
}

}  // namespace

}  // namespace tandem::convert
