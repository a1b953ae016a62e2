#include "convert/hf_to_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "convert/hf_config.h"
#include "convert/safetensors.h"
#include "convert/tensor_plan.h"
#include "convert/tokenizer_to_gguf.h"
#include "core/error.h"
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
void produce_tensor(const StTensor& src, const PlannedTensor& plan, DType out, int threads, uint8_t* dst) {
  const int64_t n_rows = src.shape.empty() ? 1 : src.shape[0];
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
std::vector<Job> match_tensors(const ModelHparams& hp, const SafetensorsModel& model, const fs::path& hf_dir,
                               std::vector<std::string>& notes) {
  std::vector<Job> jobs;
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (auto& p : plan_tensors(hp)) {
    Job job;
    job.plan = std::move(p);
    if (!job.plan.hf_name.empty()) {
      job.src = model.find(job.plan.hf_name);
      if (!job.src) {
        missing.push_back(job.plan.hf_name);
        continue;
      }
      used.insert(job.plan.hf_name);
      const auto want = hf_shape(job.plan);
      check(job.src->shape == want, job.src->file + ": tensor '" + job.plan.hf_name + "' (for " +
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

ConvertResult convert_vocab_only(const ConvertOptions& o, gguf::GgufWriter& w) {
  ConvertResult result;
  result.arch = "llama";  // llama.cpp's vocab-only files of llama-like models use this architecture
  std::optional<ModelHparams> hp;
  if (fs::exists(o.hf_dir / "config.json")) {
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

  // Renaming the output over an input would destroy the checkpoint.
  if (fs::exists(o.output)) {
    for (const char* input : {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
                              "model.safetensors.index.json"}) {
      std::error_code ec;
      check(!fs::equivalent(o.output, o.hf_dir / input, ec),
            o.output.string() + " is the checkpoint's " + input + "; choose another output file");
    }
    if (fs::equivalent(o.output.parent_path().empty() ? fs::path(".") : o.output.parent_path(), o.hf_dir))
      check(o.output.extension() != ".safetensors",
            o.output.string() + " is a safetensors file of the checkpoint; choose another output file");
  }

  gguf::GgufWriter w;
  ConvertResult result;
  if (o.vocab_only) {
    result = convert_vocab_only(o, w);
    for (const auto& n : result.notes) log_line(o, "note: " + n);
    w.write(o.output.string());
    return result;
  }

  const ModelHparams hp = load_hf_config(o.hf_dir);
  const SafetensorsModel model = SafetensorsModel::open_dir(o.hf_dir);
  std::vector<Job> jobs = match_tensors(hp, model, o.hf_dir, result.notes);

  // llama.cpp's "auto": the type of the first weight (the embeddings).
  StDType source_dtype = StDType::F32;
  for (const auto& j : jobs)
    if (j.src && j.src->shape.size() == 2) {
      source_dtype = j.src->dtype;
      break;
    }
  result.arch = hp.arch;
  result.type = resolve_auto(o.type, source_dtype);

  const bool has_output =
      std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.plan.gguf_name == "output.weight"; });
  std::map<std::string, int> fallbacks;
  for (auto& j : jobs) {
    j.type = tensor_type_for(result.type, j.plan, hp.n_layer, has_output);
    if (j.plan.ne.size() >= 2 && is_fallback_type(result.type, j.type)) ++fallbacks[dtype_name(j.type)];
  }
  for (const auto& [type, count] : fallbacks)
    result.notes.push_back(std::to_string(count) +
                           " matrices have rows (ne[0]) that are not a multiple of the " +
                           out_type_name(result.type) + " block size; they are stored as " + type);

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
  for (size_t i = 0; i < total; ++i) {
    const Job& j = jobs[i];
    const std::string progress =
        "[" + std::to_string(i + 1) + "/" + std::to_string(total) + "] " + j.plan.gguf_name;
    if (!j.src) {  // generated: rope_freqs of llama3 rope scaling
      const std::vector<float> freqs = llama3_rope_freqs(hp);
      std::vector<uint8_t> bytes(freqs.size() * 4);
      std::memcpy(bytes.data(), freqs.data(), bytes.size());
      w.add_tensor(j.plan.gguf_name, DType::F32, j.plan.ne, std::move(bytes));
      log_line(o, progress + " f32 " + ne_string(j.plan.ne) + " (generated from rope_scaling)");
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
  result.n_tensors = total;
  for (const auto& n : result.notes) log_line(o, "note: " + n);
  w.write(o.output.string());
  return result;
}

}  // namespace tandem::convert
