// Self-conditioning of diffusion-gemma (GGUF-ARCH-FACTS D.5): from the previous step's canvas logits
// [n_vocab, C] to the C vectors added to the canvas rows' scaled embeddings,
//   p = softmax(logits * temp_inv); soft = sqrt(n_embd) * sum_v p_v E16_v; n = RMS(soft) * pre_norm;
//   sc = down(gelu_tanh(gate n) * up n)
// where E16 is token_embd dequantized and rounded to F16 (kept F32 for an F32 token_embd: sc_token_rows). Two paths with the same values:
//   DeviceSelfCond  Ops on one device (the model's first rank, where the embedding reads the rows): the
//                   transposed F16 table sc_embT {n_vocab, n_embd} built once, a persistent logits buffer
//                   sc_logits {n_vocab, C} (written at the end of each forward, read by the next) and the MLP's
//                   scratch; nothing is allocated per step and every call has fixed addresses.
//   HostSelfCond    plain C++ on the host from host logits (the fallback, and the reference the test compares).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/diffusion_gemma.h"

namespace tandem {

// The SC embedding table: token_embd of `file` dequantized, n_vocab rows of n_embd (row v = token v), rounded
// to F16 (D.5: llama.cpp's F16 copy) unless token_embd is F32 — transformers multiplies by the embedding in the
// model's dtype, so an F32 model keeps F32 (the reference the parity compares with). *is_f32 says which.
std::vector<float> sc_token_rows(const gguf::GgufFile& file, int64_t n_embd, int64_t n_vocab, bool* is_f32);

class HostSelfCond {
 public:
  HostSelfCond(const gguf::GgufFile& file, int64_t n_embd, int64_t n_vocab, float eps);
  // logits: C rows of n_vocab; out: C rows of n_embd.
  void compute(std::span<const float> logits, int64_t C, float temp_inv, std::span<float> out) const;

 private:
  int64_t E_, V_, F_;
  float eps_;
  std::vector<float> emb_;                                 // [V][E], the SC table
  std::vector<float> pre_norm_, gate_, up_, down_;         // gate/up [F][E], down [E][F]
};

class DeviceSelfCond {
 public:
  // Allocates everything on `device` (throws Error when memory is short: the caller falls back to the host).
  DeviceSelfCond(Device& device, const gguf::GgufFile& file, const SelfCondWeights& w, int64_t n_embd,
                 int64_t n_vocab, int64_t C, float eps);
  Device& device() const { return device_; }
  // The persistent logits buffer {n_vocab, C} F32 (zeroed by reset()).
  const Tensor& logits() const { return logits_; }
  // The SC rows {n_embd, C} the last compute() wrote.
  const Tensor& rows() const { return out_; }
  void reset(Stream& st);
  // rows = SC(logits) on `st` (this device's stream).
  void compute(Stream& st, float temp_inv);

 private:
  Device& device_;
  Ops& ops_;
  SelfCondWeights w_;
  int64_t E_, V_, C_;
  float eps_;
  Buffer mem_;
  Tensor emb_t_, logits_, probs_, soft_, gate_, up_, act_, out_;
};

}  // namespace tandem
