#include "eval/non_finite.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/error.h"
#include "tandem/batch.h"
#include "tandem/model.h"

namespace tandem::eval {

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

std::string locate_non_finite(const Session& session, std::span<const int32_t> tokens) {
  const Model& model = session.model();
  const int64_t n_layer = model.info().n_layer;
  const int64_t n_embd = model.info().n_embd;
  const size_t n = std::min<size_t>(tokens.size(), 64);
  if (n == 0 || n_layer <= 0) return "";
  SessionParams sp;
  sp.n_ctx = int32_t(n) + 1;
  sp.n_batch = int32_t(n);
  sp.n_seq_max = 1;
  Session probe(std::const_pointer_cast<Model>(model.shared_from_this()), sp);
  std::vector<int32_t> layers;
  for (int32_t l = 0; l <= int32_t(n_layer); ++l) layers.push_back(l);
  std::vector<float> taps(n * layers.size() * size_t(n_embd));
  TapDestination dst;
  dst.device = DeviceId{};  // host memory
  dst.data = taps.data();
  probe.set_taps(layers, dst);
  Batch b;
  for (size_t i = 0; i < n; ++i) b.add(tokens[i], int32_t(i), 0, i + 1 == n);
  probe.decode(b);
  probe.synchronize();
  for (size_t k = 0; k < layers.size(); ++k) {
    for (size_t r = 0; r < n; ++r) {
      const float* row = taps.data() + (r * layers.size() + k) * size_t(n_embd);
      if (all_finite({row, size_t(n_embd)})) continue;
      if (k == 0) return "the token embeddings (the input of layer 0)";
      return "the output of layer " + std::to_string(k - 1) + " (tensors blk." + std::to_string(k - 1) +
             ".*)";
    }
  }
  return "the output head (every layer's output is finite; check output_norm and output / token_embd)";
}

void throw_non_finite(const Session& session, std::span<const int32_t> tokens, const std::string& where) {
  std::string place;
  try {
    place = locate_non_finite(session, tokens);
  } catch (const Error&) {
    place.clear();  // the diagnosis is a bonus; the error below is what matters
  }
  throw Error("the model's logits are not finite (NaN or Inf) at " + where +
              (place.empty() ? std::string("") : "; they first appear in " + place) +
              ": the weights of this file are broken");
}

}  // namespace tandem::eval
