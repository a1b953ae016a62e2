#include "convert/hf_to_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "convert/diffusion_gemma_config.h"
#include "convert/dflash_plan.h"
#include "convert/gemma4_config.h"
#include "convert/gemma4_plan.h"
#include "convert/hf_config.h"
#include "convert/safetensors.h"
#include "convert/tensor_plan.h"
#include "convert/tokenizer_to_gguf.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/half.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace tandem::convert {
namespace fs = std::filesystem;
using gguf::Value;

namespace {

// Rows converted to f32 per step when producing a tensor: bounds the scratch memory (16 MiB) whatever the
// tensor size, and is large enough for the quantizer's threads to share.
constexpr int64_t kChunkElements = int64_t(1) << 22;

std::string ne_string(const std::vector<int64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}
std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string model_name_of(const fs::path& hf_dir) {
  fs::path p = fs::weakly_canonical(fs::absolute(hf_dir));
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// Bytes of a GGUF tensor of this type and shape.
size_t gguf_nbytes(DType t, const std::vector<int64_t>& ne) {
  size_t n = dtype_row_bytes(t, ne[0]);
  for (size_t i = 1; i < ne.size(); ++i) n *= size_t(ne[i]);
  return n;
}

// f32 -> f16 for a whole chunk; a finite value beyond the f16 range would silently become inf, so it is an
// error.
void f32_to_f16_checked(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(src[i]);
    if ((h & 0x7c00) == 0x7c00 && std::isfinite(src[i]))
      throw Error("value " + std::to_string(src[i]) +
                  " is beyond the f16 range (65504); convert with --type bf16 or --type f32 instead");
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

// Fills dst (the GGUF bytes of `plan`, type out) from the safetensors tensor src. Rows are HF rows (the
// outermost dim); the llama Q/K permutation reorders them.
void produce_tensor(const StTensor& full, const PlannedTensor& plan, DType out, int threads, uint8_t* dst) {
  // A trimmed tensor (token_embd cut to the tokenizer's size) is a view of the first rows of the source.
  StTensor src = full;
  if (plan.hf_rows > 0 && !src.shape.empty()) {
    src.shape[0] = plan.ne.back();
    src.nbytes = size_t(src.nelements()) * st_dtype_size(src.dtype);
  }
  // Without a permutation any tensor is rows of ne[0] (3-D expert blocks quantize row by row); the llama
  // permutation moves HF rows (the outermost dim).
  const int64_t n_rows = plan.permute_heads == 0 && !plan.ne.empty() && plan.ne[0] > 0
                             ? src.nelements() / plan.ne[0]
                             : (src.shape.empty() ? 1 : src.shape[0]);
  if (n_rows == 0 || src.nelements() == 0) return;
  const int64_t row_elems = src.nelements() / n_rows;
  const size_t src_row_bytes = size_t(row_elems) * st_dtype_size(src.dtype);
  auto src_row = [&](int64_t r) {
    return plan.permute_heads > 0 ? llama_permuted_source_row(r, n_rows, plan.permute_heads) : r;
  };

  const bool same_type = (out == DType::F32 && src.dtype == StDType::F32) ||
                         (out == DType::F16 && src.dtype == StDType::F16) ||
                         (out == DType::BF16 && src.dtype == StDType::BF16);
  if (same_type) {  // the bytes are kept exactly, only rows move
    if (plan.permute_heads == 0) {
      std::memcpy(dst, src.data, src.nbytes);
    } else {
      for (int64_t r = 0; r < n_rows; ++r)
        std::memcpy(dst + size_t(r) * src_row_bytes, src.data + size_t(src_row(r)) * src_row_bytes,
                    src_row_bytes);
    }
    return;
  }

  // 1-D tensors are rows of one element here; quantized outputs are 2-D, whose HF rows are GGUF rows.
  const size_t out_row_bytes = dtype_row_bytes(out, row_elems);
  const int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / row_elems);
  std::vector<float> buf(size_t(std::min(chunk_rows, n_rows) * row_elems));
  for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
    const int64_t nr = std::min(chunk_rows, n_rows - r0);
    for (int64_t r = 0; r < nr; ++r)
      st_to_f32(src.dtype, src.data + size_t(src_row(r0 + r)) * src_row_bytes, buf.data() + r * row_elems,
                row_elems);
    uint8_t* d = dst + size_t(r0) * out_row_bytes;
    const int64_t n = nr * row_elems;
    switch (out) {
      case DType::F32:
        std::memcpy(d, buf.data(), size_t(n) * 4);
        break;
      case DType::F16:
        f32_to_f16_checked(buf.data(), d, n);
        break;
      case DType::BF16:
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = fp32_to_bf16(buf[size_t(i)]);
          std::memcpy(d + 2 * i, &h, 2);
        }
        break;
      default:
        quant::quantize_matrix(out, buf.data(), d, nr, row_elems, threads);
        break;
    }
  }
}

struct Job {
  PlannedTensor plan;
  const StTensor* src = nullptr;  // null for generated tensors
  DType type = DType::F32;
};

// Checks every expected tensor against the checkpoint: present, right shape, a float dtype.
// What match_tensors needs to know of the model, whatever its architecture.
struct ModelFacts {
  std::string hf_architecture, arch;
  bool tie_word_embeddings = false;
};

std::vector<Job> match_tensors(std::vector<PlannedTensor> plan, const ModelFacts& hp,
                               const SafetensorsModel& model, const fs::path& hf_dir,
                               std::vector<std::string>& notes) {
  std::vector<Job> jobs;
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (auto& p : plan) {
    Job job;
    job.plan = std::move(p);
    if (!job.plan.hf_name.empty()) {
      job.src = model.find(job.plan.hf_name);
      if (!job.src && job.plan.optional) continue;
      if (!job.src) {
        missing.push_back(job.plan.hf_name);
        continue;
      }
      used.insert(job.plan.hf_name);
      const auto want = hf_shape(job.plan);
      // A scalar parameter (diffusion-gemma's layer_scalar) may be stored 0-d: the same one value as {1}.
      const bool scalar = want == std::vector<int64_t>{1} && job.src->shape.empty();
      check(job.src->shape == want || scalar, job.src->file + ": tensor '" + job.plan.hf_name + "' (for " +
                                        job.plan.gguf_name + ") has shape " + job.src->shape_string() +
                                        ", but config.json implies " + shape_string(want));
      check(st_dtype_is_float(job.src->dtype), job.src->file + ": tensor '" + job.plan.hf_name +
                                                   "' has dtype " + st_dtype_name(job.src->dtype) +
                                                   "; tandem convert reads F32, F16, BF16 and F64 weights");
    }
    jobs.push_back(std::move(job));
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ... (" + std::to_string(missing.size() - 5) + " more)";
    std::string hint;
    if (missing[0] == "lm_head.weight") hint = " (config.json has tie_word_embeddings = false)";
    throw Error(hf_dir.string() + ": the checkpoint is missing " + std::to_string(missing.size()) +
                " tensor(s) that " + hp.hf_architecture + " with this config.json needs: " + list + hint);
  }

  std::vector<std::string> ignored;
  for (const StTensor* t : model.tensors())
    if (!used.count(t->name)) ignored.push_back(t->name);
  if (!ignored.empty()) {
    std::string list;
    for (size_t i = 0; i < ignored.size() && i < 4; ++i) list += (i ? ", " : "") + ignored[i];
    if (ignored.size() > 4) list += ", ...";
    std::string why = hp.tie_word_embeddings && model.find("lm_head.weight")
                          ? " (lm_head.weight is unused because tie_word_embeddings is true)"
                          : "";
    notes.push_back("ignoring " + std::to_string(ignored.size()) + " checkpoint tensor(s) that " + hp.arch +
                    " does not use: " + list + why);
  }
  return jobs;
}

// llama.cpp's loader takes n_vocab from the token list and requires token_embd / output to have that many
// rows, so its converter pads the token list to config.json's vocab_size (checkpoints round the embedding
// table up, e.g. Qwen3's 151936 rows for 151669 tokens) with "[PAD<id>]" tokens of type UNUSED (5) and score
// -1000. Done here, after the tokenizer keys are set, because only the converter knows the embedding rows.
void pad_vocab_to(gguf::GgufWriter& w, int64_t n_vocab, const fs::path& hf_dir,
                  std::vector<std::string>& notes) {
  const Value* tokens = nullptr;
  for (const auto& [k, v] : w.metadata())
    if (k == "tokenizer.ggml.tokens") tokens = &v;
  if (!tokens) return;
  const int64_t n_tokens = int64_t(tokens->as_array().size());
  check(n_tokens <= n_vocab, (hf_dir / "tokenizer.json").string() + " has " + std::to_string(n_tokens) +
                                 " tokens, more than the " + std::to_string(n_vocab) +
                                 " rows of the embedding table (config.json vocab_size)");
  if (n_tokens == n_vocab) return;

  std::vector<std::pair<std::string, Value>> padded;
  for (const auto& [k, v] : w.metadata()) {
    if (k != "tokenizer.ggml.tokens" && k != "tokenizer.ggml.token_type" && k != "tokenizer.ggml.scores")
      continue;
    check(v.type() == gguf::ValueType::ARRAY && int64_t(v.as_array().size()) == n_tokens,
          "internal: " + k + " does not have one entry per token");
    std::vector<Value> elems = v.as_array();
    for (int64_t id = n_tokens; id < n_vocab; ++id) {
      if (k == "tokenizer.ggml.tokens") elems.push_back(Value::string("[PAD" + std::to_string(id) + "]"));
      if (k == "tokenizer.ggml.token_type") elems.push_back(Value::i32(5));
      if (k == "tokenizer.ggml.scores") elems.push_back(Value::f32(-1000.0f));
    }
    padded.emplace_back(k, Value::array(v.element_type(), std::move(elems)));
  }
  for (auto& [k, v] : padded) w.set(k, std::move(v));
  notes.push_back("padded the vocabulary from " + std::to_string(n_tokens) + " to " +
                  std::to_string(n_vocab) + " tokens (config.json vocab_size) with [PAD<id>] tokens");
}

void log_line(const ConvertOptions& o, const std::string& s) {
  if (o.log) o.log(s);
}

std::string read_text(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return {};
  return read_regular_file(p.string(), "the checkpoint's");  // a FIFO or directory is an error, not a hang
}

// The first entry of config.json's "architectures", or "".
std::string hf_architecture_of(const fs::path& hf_dir) {
  const fs::path p = hf_dir / "config.json";
  if (!fs::exists(p)) return "";
  const auto j = nlohmann::json::parse(read_text(p), nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty() && j["architectures"][0].is_string())
    return j["architectures"][0].get<std::string>();
  return "";
}

bool is_diffusion_gemma_checkpoint(const fs::path& hf_dir) {
  return is_diffusion_gemma_architecture(hf_architecture_of(hf_dir));
}

// True when config.json names a Gemma 4 text architecture (converted by convert_gemma4, facts C).
bool is_gemma4_checkpoint(const fs::path& hf_dir) {
  const fs::path p = hf_dir / "config.json";
  if (!fs::exists(p)) return false;
  const auto j = nlohmann::json::parse(read_text(p), nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("architectures") && j["architectures"].is_array() &&
         !j["architectures"].empty() && j["architectures"][0].is_string() &&
         is_gemma4_architecture(j["architectures"][0].get<std::string>());
}

int64_t token_count(const gguf::GgufWriter& w) {
  for (const auto& [k, v] : w.metadata())
    if (k == "tokenizer.ggml.tokens") return int64_t(v.as_array().size());
  return 0;
}

ConvertResult convert_vocab_only(const ConvertOptions& o, gguf::GgufWriter& w) {
  ConvertResult result;
  result.arch = "llama";  // llama.cpp's vocab-only files of llama-like models use this architecture
  std::optional<ModelHparams> hp;
  if (is_gemma4_checkpoint(o.hf_dir)) {
    result.arch = "gemma4";
  } else if (is_diffusion_gemma_checkpoint(o.hf_dir)) {
    result.arch = "diffusion-gemma";
  } else if (fs::exists(o.hf_dir / "config.json")) {
    hp = load_hf_config(o.hf_dir);
    result.arch = hp->arch;
  } else {
    result.notes.push_back("no config.json: writing general.architecture = llama");
  }
  w.set("general.architecture", Value::string(result.arch));
  w.set("general.type", Value::string("model"));
  w.set("general.name", Value::string(o.name.empty() ? model_name_of(o.hf_dir) : o.name));
  add_tokenizer_metadata(o.hf_dir, w);
  if (hp) pad_vocab_to(w, hp->n_vocab, o.hf_dir, result.notes);
  return result;
}

// Adds every job's tensor to w; generated tensors (rope_freqs) get their values from generate. The tensors
// are produced while w writes, so jobs must outlive w.write().
void add_tensor_jobs(const ConvertOptions& o, gguf::GgufWriter& w, const std::vector<Job>& jobs,
                     const std::function<std::vector<float>(const PlannedTensor&)>& generate) {
  const size_t total = jobs.size();
  for (size_t i = 0; i < total; ++i) {
    const Job& j = jobs[i];
    // Appended piece by piece: GCC 12 at -O3 misreports a chain of string + as overlapping (-Wrestrict).
    std::string progress = "[";
    progress += std::to_string(i + 1);
    progress += '/';
    progress += std::to_string(total);
    progress += "] ";
    progress += j.plan.gguf_name;
    if (!j.src) {  // generated: rope_freqs
      const std::vector<float> freqs = generate(j.plan);
      std::vector<uint8_t> bytes(freqs.size() * 4);
      std::memcpy(bytes.data(), freqs.data(), bytes.size());
      w.add_tensor(j.plan.gguf_name, DType::F32, j.plan.ne, std::move(bytes));
      log_line(o, progress + " f32 " + ne_string(j.plan.ne) + " (generated)");
      continue;
    }
    const int threads = o.threads;
    w.add_tensor(j.plan.gguf_name, j.type, j.plan.ne, gguf_nbytes(j.type, j.plan.ne),
                 [&o, &j, threads, progress](uint8_t* dst) {
                   log_line(o, progress + " " + st_dtype_name(j.src->dtype) + " " + j.src->shape_string() +
                                   " -> " + dtype_name(j.type) + " " + ne_string(j.plan.ne) +
                                   (j.plan.permute_heads ? " (q/k rows permuted)" : ""));
                   try {
                     produce_tensor(*j.src, j.plan, j.type, threads, dst);
                   } catch (const Error& e) {
                     throw Error(j.src->file + ": tensor '" + j.src->name + "' -> " + j.plan.gguf_name +
                                 ": " + e.what());
                   }
                 });
  }
}

// Sets each job's stored type for --type; the fallback notes go to notes.
void choose_types(std::vector<Job>& jobs, OutType type, int64_t n_layer, std::vector<std::string>& notes) {
  const bool has_output =
      std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.plan.gguf_name == "output.weight"; });
  std::map<std::string, int> fallbacks;
  for (auto& j : jobs) {
    j.type = tensor_type_for(type, j.plan, n_layer, has_output);
    // llama.cpp's converter keeps the MoE router in F32 whatever the output type.
    if (j.plan.gguf_name.find("ffn_gate_inp.") != std::string::npos)
      j.type = DType::F32;
    else if (j.plan.ne.size() >= 2 && is_fallback_type(type, j.type))
      ++fallbacks[dtype_name(j.type)];
  }
  for (const auto& [t, count] : fallbacks)
    notes.push_back(std::to_string(count) + " matrices have rows (ne[0]) that are not a multiple of the " +
                    out_type_name(type) + " block size; they are stored as " + t);
}

StDType first_matrix_dtype(const std::vector<Job>& jobs) {
  for (const auto& j : jobs)
    if (j.src && j.src->shape.size() == 2) return j.src->dtype;
  return StDType::F32;
}

// Gemma 4 (facts C): keys, tokenizer, trimmed embeddings, generated rope_freqs, per-layer shapes.
ConvertResult convert_gemma4(const ConvertOptions& o, gguf::GgufWriter& w) {
  ConvertResult result;
  result.arch = "gemma4";
  const fs::path cfg = o.hf_dir / "config.json";
  const Gemma4Hparams hp = parse_gemma4_config(read_text(cfg), cfg.string());

  // The tokenizer first: its token count is the number of embedding rows kept.
  gguf::GgufWriter tok;
  add_tokenizer_metadata(o.hf_dir, tok);
  const int64_t n_tokens = token_count(tok);
  check(n_tokens > 0, (o.hf_dir / "tokenizer.json").string() + ": no tokens");
  check(n_tokens <= hp.n_vocab, (o.hf_dir / "tokenizer.json").string() + " has " + std::to_string(n_tokens) +
                                    " tokens, more than config.json vocab_size " +
                                    std::to_string(hp.n_vocab));

  const SafetensorsModel model = SafetensorsModel::open_dir(o.hf_dir);
  std::vector<Job> jobs =
      match_tensors(plan_gemma4_tensors(hp, n_tokens), {hp.hf_architecture, "gemma4", hp.tie_word_embeddings},
                    model, o.hf_dir, result.notes);
  if (n_tokens < hp.n_vocab)
    result.notes.push_back("token_embd trimmed from " + std::to_string(hp.n_vocab) + " to " +
                           std::to_string(n_tokens) + " rows (the tokenizer's size)");
  result.type = resolve_auto(o.type, first_matrix_dtype(jobs));
  choose_types(jobs, result.type, hp.n_layer, result.notes);

  w.set("general.architecture", Value::string("gemma4"));
  w.set("general.type", Value::string("model"));
  w.set("general.name", Value::string(o.name.empty() ? model_name_of(o.hf_dir) : o.name));
  add_gemma4_metadata(hp, w);
  w.set("general.file_type", Value::u32(file_type_of(result.type)));
  w.set("general.quantization_version", Value::u32(2));
  for (const auto& [k, v] : tok.metadata()) w.set(k, v);
  // facts C.1: Gemma 4 tokenizers add BOS and no space prefix.
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  w.set("tokenizer.ggml.add_space_prefix", Value::boolean(false));

  add_tensor_jobs(o, w, jobs, [&hp](const PlannedTensor&) { return gemma4_rope_freqs(hp); });
  result.n_tensors = jobs.size();
  for (const auto& n : result.notes) log_line(o, "note: " + n);
  w.write(o.output.string());
  return result;
}

// DiffusionGemma (facts D.1): gemma4 keys under diffusion-gemma.*, the decoder's tensors renamed, the encoder's
// layer scalars, the self-conditioning MLP, control tokens retyped, the mask token, the diffusion.* keys.
ConvertResult convert_diffusion_gemma(const ConvertOptions& o, gguf::GgufWriter& w) {
  ConvertResult result;
  result.arch = "diffusion-gemma";
  const fs::path cfg = o.hf_dir / "config.json", gen = o.hf_dir / "generation_config.json";
  const DiffusionGemmaConfig c = parse_diffusion_gemma_config(
      read_text(cfg), cfg.string(), fs::exists(gen) ? read_text(gen) : std::string(), gen.string());

  gguf::GgufWriter tok;
  add_tokenizer_metadata(o.hf_dir, tok);
  const int64_t n_tokens = token_count(tok);
  check(n_tokens > 0, (o.hf_dir / "tokenizer.json").string() + ": no tokens");
  check(n_tokens <= c.text.n_vocab, (o.hf_dir / "tokenizer.json").string() + " has " +
                                        std::to_string(n_tokens) + " tokens, more than config.json vocab_size " +
                                        std::to_string(c.text.n_vocab));
  const int64_t retyped = retype_control_tokens(tok);
  if (retyped > 0) result.notes.push_back(std::to_string(retyped) + " control-looking tokens retyped CONTROL");
  std::optional<int64_t> mask_id = c.mask_token_id;
  if (!mask_id && fs::exists(o.hf_dir / "tokenizer_config.json")) {  // its "mask_token", by name
    const auto tc = nlohmann::json::parse(read_text(o.hf_dir / "tokenizer_config.json"), nullptr, false);
    if (tc.is_object() && tc.contains("mask_token")) {
      std::string name;
      if (tc["mask_token"].is_string()) name = tc["mask_token"].get<std::string>();
      if (tc["mask_token"].is_object() && tc["mask_token"].contains("content") &&
          tc["mask_token"]["content"].is_string())
        name = tc["mask_token"]["content"].get<std::string>();
      for (const auto& [k, v] : tok.metadata())
        if (k == "tokenizer.ggml.tokens" && !name.empty()) {
          const std::vector<std::string> names = v.as_string_array();
          for (size_t i = 0; i < names.size(); ++i)
            if (names[i] == name) mask_id = int64_t(i);
        }
    }
  }
  const int64_t mask = find_mask_token(tok, mask_id, o.hf_dir.string());

  const SafetensorsModel model = SafetensorsModel::open_dir(o.hf_dir);
  std::vector<PlannedTensor> plan = plan_diffusion_gemma_tensors(c, n_tokens);
  // The encoder's weights are the decoder's (D.1): a checkpoint may store a shared tensor once under the
  // encoder's name (or without the decoder prefix). The layer scalars differ and are never substituted.
  int64_t renamed = 0;
  for (PlannedTensor& p : plan) {  // the encoder's scalars without "language_model." (older layouts)
    if (p.hf_name.starts_with(c.encoder_prefix) && !model.find(p.hf_name)) {
      const std::string alt = "model.encoder." + p.hf_name.substr(c.encoder_prefix.size());
      if (model.find(alt)) p.hf_name = alt;
    }
  }
  for (PlannedTensor& p : plan) {
    const std::string& pre = c.text.tensor_prefix;
    if (p.hf_name.empty() || model.find(p.hf_name) || !p.hf_name.starts_with(pre) ||
        p.hf_name.ends_with("layer_scalar"))
      continue;
    const std::string rest = p.hf_name.substr(pre.size());
    for (const std::string& alt : {c.encoder_prefix + rest, "model." + rest, "model.language_model." + rest})
      if (model.find(alt)) {
        p.hf_name = alt;
        ++renamed;
        break;
      }
  }
  if (renamed > 0)
    result.notes.push_back(std::to_string(renamed) + " decoder tensors read from their shared encoder / plain names");
  std::vector<Job> jobs = match_tensors(std::move(plan),
                                        {c.text.hf_architecture, "diffusion-gemma", true}, model, o.hf_dir,
                                        result.notes);
  if (n_tokens < c.text.n_vocab)
    result.notes.push_back("token_embd trimmed from " + std::to_string(c.text.n_vocab) + " to " +
                           std::to_string(n_tokens) + " rows (the tokenizer's size)");
  if (!model.find(c.text.tensor_prefix + "self_conditioning.gate_proj.weight"))
    result.notes.push_back("the checkpoint has no self-conditioning MLP: the model runs without SC");
  result.type = resolve_auto(o.type, first_matrix_dtype(jobs));
  choose_types(jobs, result.type, c.text.n_layer, result.notes);

  w.set("general.architecture", Value::string("diffusion-gemma"));
  w.set("general.type", Value::string("model"));
  w.set("general.name", Value::string(o.name.empty() ? model_name_of(o.hf_dir) : o.name));
  add_gemma4_metadata(c.text, w, "diffusion-gemma");
  w.set("diffusion-gemma.attention.causal", Value::boolean(false));
  w.set("diffusion.canvas_length", Value::u32(uint32_t(c.canvas_length)));
  for (const auto& [k, v] : c.diffusion_keys) w.set(k, v);
  w.set("general.file_type", Value::u32(file_type_of(result.type)));
  w.set("general.quantization_version", Value::u32(2));
  for (const auto& [k, v] : tok.metadata()) w.set(k, v);
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  w.set("tokenizer.ggml.add_space_prefix", Value::boolean(false));
  w.set("tokenizer.ggml.mask_token_id", Value::u32(uint32_t(mask)));

  add_tensor_jobs(o, w, jobs, [&c](const PlannedTensor&) { return gemma4_rope_freqs(c.text); });
  result.n_tensors = jobs.size();
  for (const auto& n : result.notes) log_line(o, "note: " + n);
  w.write(o.output.string());
  return result;
}

// The architecture named first in config.json, "" when there is none (the parsers give the messages).
std::string first_architecture(const fs::path& hf_dir) {
  const nlohmann::json j = nlohmann::json::parse(read_text(hf_dir / "config.json"), nullptr, false);
  if (!j.is_object() || !j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string())
    return "";
  return j["architectures"][0].get<std::string>();
}

// A z-lab DFlash drafter (facts E.1): the Qwen3 keys under dflash., its own keys, the target's vocabulary.
ConvertResult convert_dflash(const ConvertOptions& o, gguf::GgufWriter& w) {
  ConvertResult result;
  result.arch = "dflash";
  check(!o.target_model_dir.empty(),
        o.hf_dir.string() + " is a DFlash drafter: give its target model's Hugging Face directory with "
                            "--target-model-dir (the drafter uses the target's vocabulary)");
  check(fs::is_directory(o.target_model_dir), o.target_model_dir.string() + ": not a directory");
  const fs::path cfg = o.hf_dir / "config.json";
  const DflashConfig c = parse_dflash_config(read_text(cfg), cfg.string());
  const ModelHparams target = load_hf_config(o.target_model_dir);
  check(target.n_embd == c.hp.n_embd,
        "the DFlash drafter's hidden_size (" + std::to_string(c.hp.n_embd) + ") differs from the target's (" +
            std::to_string(target.n_embd) + ", " + o.target_model_dir.string() +
            "): the drafter reads the target's hidden states at its own width");
  for (int32_t l : c.target_layers)
    check(l <= target.n_layer, cfg.string() + ": target layer id " + std::to_string(l - 1) +
                                   " is not a layer of the target (" + std::to_string(target.n_layer) +
                                   " layers)");
  check(c.mask_token_id < target.n_vocab, cfg.string() + ": mask_token_id " + std::to_string(c.mask_token_id) +
                                              " is outside the target's vocabulary (" +
                                              std::to_string(target.n_vocab) + ")");
  const SafetensorsModel model = SafetensorsModel::open_dir(o.hf_dir);
  check(model.find("d2t") == nullptr && model.find("model.d2t") == nullptr,
        o.hf_dir.string() + ": the checkpoint has a d2t (reduced draft vocabulary) tensor; converting it is "
                            "not supported yet");
  const std::string prefix = model.find("model.fc.weight") ? "model." : "";
  std::vector<Job> jobs =
      match_tensors(plan_dflash_tensors(c, prefix), {c.hp.hf_architecture, "dflash", false}, model, o.hf_dir,
                    result.notes);
  for (const Job& j : jobs)
    if (j.plan.gguf_name == "token_embd.weight" || j.plan.gguf_name == "output.weight")
      check(j.plan.ne.back() == target.n_vocab || !j.src,
            "the DFlash drafter's " + j.plan.gguf_name + " has " + std::to_string(j.plan.ne.back()) +
                " rows, the target's vocabulary " + std::to_string(target.n_vocab));
  result.type = resolve_auto(o.type, first_matrix_dtype(jobs));
  choose_types(jobs, result.type, c.hp.n_layer, result.notes);

  w.set("general.architecture", Value::string("dflash"));
  w.set("general.type", Value::string("model"));
  w.set("general.name", Value::string(o.name.empty() ? model_name_of(o.hf_dir) : o.name));
  add_hparams_metadata(c.hp, w);
  w.set("dflash.block_size", Value::u32(uint32_t(c.block_size)));
  w.set("dflash.target_layers", Value::i32_array(c.target_layers));
  if (c.sliding_window > 0) {
    w.set("dflash.attention.sliding_window", Value::u32(uint32_t(c.sliding_window)));
    std::vector<Value> pattern;
    for (bool s : c.sliding) pattern.push_back(Value::boolean(s));
    w.set("dflash.attention.sliding_window_pattern", Value::array(gguf::ValueType::BOOL, std::move(pattern)));
  }
  w.set("general.file_type", Value::u32(file_type_of(result.type)));
  w.set("general.quantization_version", Value::u32(2));
  add_tokenizer_metadata(o.target_model_dir, w);
  pad_vocab_to(w, target.n_vocab, o.target_model_dir, result.notes);
  w.set("tokenizer.ggml.mask_token_id", Value::u32(uint32_t(c.mask_token_id)));

  add_tensor_jobs(o, w, jobs, [](const PlannedTensor&) { return std::vector<float>{}; });
  result.n_tensors = jobs.size();
  for (const auto& n : result.notes) log_line(o, "note: " + n);
  w.write(o.output.string());
  return result;
}

}  // namespace

ConvertResult convert_hf_to_gguf(const ConvertOptions& o) {
  check(fs::is_directory(o.hf_dir),
        o.hf_dir.string() +
            ": not a directory (expected a Hugging Face model directory with config.json, "
            "*.safetensors and tokenizer.json)");
  check(!o.output.empty(), "no output file given");
  const fs::path out_dir = o.output.parent_path().empty() ? fs::path(".") : o.output.parent_path();
  check(fs::is_directory(out_dir),
        o.output.string() + ": the output directory " + out_dir.string() + " does not exist");

  // Renaming the output over an input would destroy the checkpoint: every file convert may read (the JSON
  // configs, the tokenizer files, the safetensors shards) of the checkpoint and of the DFlash target is
  // refused as the output, however it is reached (another name, a symlink, a hard link: same inode).
  if (fs::exists(o.output)) {
    for (const fs::path& dir : {o.hf_dir, o.target_model_dir}) {
      std::error_code ec;
      if (dir.empty() || !fs::is_directory(dir, ec)) continue;
      for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        const std::string ext = e.path().extension().string();
        if (ext != ".json" && ext != ".safetensors" && ext != ".model" && ext != ".jinja" && ext != ".txt")
          continue;
        std::error_code eq;
        check(!fs::equivalent(o.output, e.path(), eq), o.output.string() + " is " + e.path().string() +
                                                           ", an input of the conversion; choose another " +
                                                           "output file");
      }
    }
  }

  gguf::GgufWriter w;
  ConvertResult result;
  if (o.vocab_only) {
    result = convert_vocab_only(o, w);
    for (const auto& n : result.notes) log_line(o, "note: " + n);
    w.write(o.output.string());
    return result;
  }

  if (is_gemma4_checkpoint(o.hf_dir)) return convert_gemma4(o, w);
  if (is_diffusion_gemma_checkpoint(o.hf_dir)) return convert_diffusion_gemma(o, w);
  if (is_dflash_architecture(first_architecture(o.hf_dir))) return convert_dflash(o, w);
  check(o.target_model_dir.empty(), "--target-model-dir is for DFlash drafters (DFlashDraftModel) only");

  const ModelHparams hp = load_hf_config(o.hf_dir);
  const SafetensorsModel model = SafetensorsModel::open_dir(o.hf_dir);
  std::vector<Job> jobs = match_tensors(
      plan_tensors(hp), {hp.hf_architecture, hp.arch, hp.tie_word_embeddings}, model, o.hf_dir, result.notes);

  // llama.cpp's "auto": the type of the first weight (the embeddings).
  StDType source_dtype = StDType::F32;
  for (const auto& j : jobs)
    if (j.src && j.src->shape.size() == 2) {
      source_dtype = j.src->dtype;
      break;
    }
  result.arch = hp.arch;
  result.type = resolve_auto(o.type, source_dtype);

  choose_types(jobs, result.type, hp.n_layer, result.notes);

  // Metadata, in the order llama.cpp's converter writes it.
  w.set("general.architecture", Value::string(hp.arch));
  w.set("general.type", Value::string("model"));
  w.set("general.name", Value::string(o.name.empty() ? model_name_of(o.hf_dir) : o.name));
  add_hparams_metadata(hp, w);
  w.set("general.file_type", Value::u32(file_type_of(result.type)));
  w.set("general.quantization_version", Value::u32(2));
  add_tokenizer_metadata(o.hf_dir, w);
  pad_vocab_to(w, hp.n_vocab, o.hf_dir, result.notes);

  const size_t total = jobs.size();
  add_tensor_jobs(o, w, jobs, [&hp](const PlannedTensor&) { return llama3_rope_freqs(hp); });
  result.n_tensors = total;
  for (const auto& n : result.notes) log_line(o, "note: " + n);
  w.write(o.output.string());
  return result;
}

}  // namespace tandem::convert
