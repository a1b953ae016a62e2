// The DFlash drafter (speculative.h, GGUF-ARCH-FACTS E.4). Its cache holds, per sequence, K/V injected from
// the target's features at the positions the target has decoded; after each target decode it injects the
// rows of that batch (target_decoded), and each draft() first trims what the target rejected, then runs one
// block [last, mask x n] per sequence, all sequences in one pass, rows that write no K/V (the cache stays
// the injected context).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "core/error.h"
#include "model/dflash.h"
#include "model/model_impl.h"
#include "runtime/session_impl.h"
#include "sampling/draft_sampling.h"
#include "tandem/speculative.h"

namespace tandem {

namespace {

constexpr uint64_t kDflashStream = 0xDF1A5DULL;  // the drafter's random stream: the target's seed ^ this

bool env_device_features() {
  const char* v = std::getenv("TANDEM_DFLASH_DEVICE_FEATURES");
  return !(v && std::string(v) == "0");
}

}  // namespace

struct DflashDrafter::Impl {
  Session& draft;
  Session& target;
  DflashInfo info;
  int64_t n_embd = 0;
  int32_t n_rows = 0;                  // rows of the feature buffer: the target's n_batch
  std::vector<int32_t> sorted_layers;  // target_layers ascending (what set_taps takes)
  std::vector<size_t> tap_of;          // per file-order feature k: its index in sorted_layers
  bool device = false;                 // the device path runs
  Buffer features;                     // device path: {n_taps * n_embd, n_rows} on the drafter's device
  std::vector<float> host_taps;        // host path: taps in ascending layer order, per row
  std::unique_ptr<Event> read;         // recorded after the drafter has read the features
  Stream* draft_stream = nullptr;
  DeviceId draft_device{};
  std::vector<std::unique_ptr<Sampler>> samplers;  // per sequence id: the draft sampler (temperature > 0)
  std::unique_ptr<Sampler> greedy;                 // the argmax of greedy drafts, on the device

  Impl(Session& d, Session& t) : draft(d), target(t) {}
  size_t row_floats() const { return info.target_layers.size() * size_t(n_embd); }
};

DflashDrafter::DflashDrafter(Session& draft, Session& target, const DflashDrafterParams& params)
    : impl_(std::make_unique<Impl>(draft, target)) {
  Impl& s = *impl_;
  const Model& dm = draft.model();
  const Model& tm = target.model();
  check(dm.info().arch == "dflash",
        dm.info().path + " is a " + dm.info().arch + " model, not a DFlash drafter (architecture dflash)");
  s.info = read_dflash_info(*dm.impl().file);
  s.n_embd = dm.info().n_embd;
  check(s.n_embd == tm.info().n_embd, "the DFlash drafter's hidden size (" + std::to_string(s.n_embd) +
                                          ") differs from the target's (" + std::to_string(tm.info().n_embd) +
                                          "): it reads the target's hidden states at its own width");
  for (int32_t l : s.info.target_layers)
    check(l >= 0 && l <= tm.info().n_layer, "the DFlash drafter reads target layer " + std::to_string(l) +
                                                ", but the target has " + std::to_string(tm.info().n_layer) +
                                                " layers (taps 0.." + std::to_string(tm.info().n_layer) +
                                                ")");
  check(s.info.mask_token_id < target.n_vocab(),
        "the DFlash mask token " + std::to_string(s.info.mask_token_id) +
            " is not in the target's vocabulary (" + std::to_string(target.n_vocab()) + " tokens)");
  for (int32_t id : s.info.d2t)
    check(id < target.n_vocab(), "the DFlash drafter's d2t maps to token " + std::to_string(id) +
                                     ", outside the target's vocabulary (" +
                                     std::to_string(target.n_vocab()) + " tokens)");
  check(!s.info.d2t.empty() || draft.n_vocab() == target.n_vocab(),
        "the DFlash drafter's vocabulary (" + std::to_string(draft.n_vocab()) +
            ") differs from the target's (" + std::to_string(target.n_vocab()) +
            ") and it has no d2t mapping");
  s.sorted_layers = s.info.target_layers;
  std::sort(s.sorted_layers.begin(), s.sorted_layers.end());
  for (int32_t l : s.info.target_layers)
    s.tap_of.push_back(
        size_t(std::find(s.sorted_layers.begin(), s.sorted_layers.end(), l) - s.sorted_layers.begin()));
  s.n_rows = target.params().n_batch;
  RankState& dr = *draft.impl().ranks.front();
  s.draft_stream = &dr.stream;
  s.draft_device = dr.device.id();

  // The device path needs the target layers in ascending order (the buffer holds them in file order and
  // taps are written in ascending order), every target rank able to write the drafter's device, and the
  // memory.
  const bool ascending = std::is_sorted(s.info.target_layers.begin(), s.info.target_layers.end());
  bool reachable = true;
  for (const auto& r : target.impl().ranks) reachable &= r->device.id().kind == s.draft_device.kind;
  const bool wanted = params.device_features < 0 ? env_device_features() : params.device_features != 0;
  std::string why;
  if (!wanted) {
    why = "TANDEM_DFLASH_DEVICE_FEATURES=0";
  } else if (!ascending) {
    why = "the target layers are not ascending";
  } else if (!reachable) {
    why = "the drafter's device " + s.draft_device.to_string() + " cannot be written by the target's layers";
  } else {
    try {
      s.features = dr.device.allocate(s.row_floats() * size_t(s.n_rows) * sizeof(float));
      s.device = true;
    } catch (const Error& e) {
      why = std::string("the feature buffer cannot be allocated (") + e.what() + ")";
    }
  }
  TapDestination dst;
  dst.tap_stride = size_t(s.n_embd) * sizeof(float);
  dst.row_stride = s.row_floats() * sizeof(float);
  dst.n_rows = s.n_rows;
  if (s.device) {
    s.read = dr.device.create_event();
    dst.device = s.draft_device;
    dst.data = s.features.data();
    dst.read = s.read.get();
  } else {
    s.host_taps.assign(s.row_floats() * size_t(s.n_rows), 0.0f);
    dst.device = DeviceId{DeviceKind::CPU, 0};
    dst.data = s.host_taps.data();
  }
  target.set_taps(s.sorted_layers, dst);
  if (params.log) {
    std::string layers;
    for (int32_t l : s.info.target_layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
    std::fprintf(stderr, "dflash: target features of layers [%s] %s\n", layers.c_str(),
                 s.device ? ("stay on the device (" + s.draft_device.to_string() + ")").c_str()
                          : ("go through host memory: " + why).c_str());
  }
}

DflashDrafter::~DflashDrafter() {
  try {
    impl_->target.set_taps({}, {});
  } catch (...) {  // a destructor does not throw; taps stay pointed at memory nobody reads again
  }
}

bool DflashDrafter::device_features() const {
  return impl_->device;
}
int32_t DflashDrafter::block_size() const {
  return impl_->info.block_size;
}
const std::vector<int32_t>& DflashDrafter::target_layers() const {
  return impl_->info.target_layers;
}
int32_t DflashDrafter::max_target_rows() const {
  return impl_->n_rows;
}

void DflashDrafter::reset(int32_t seq) {
  Impl& s = *impl_;
  if (size_t(seq) < s.samplers.size()) s.samplers[size_t(seq)].reset();
  s.draft.seq_clear(seq);
}

void DflashDrafter::fork(int32_t src, int32_t dst, int32_t n) {
  Impl& s = *impl_;
  reset(dst);
  if (n <= 0) return;
  check(s.draft.seq_len(src) >= n,
        "dflash: fork of " + std::to_string(n) + " positions of sequence " + std::to_string(src) +
            ", whose drafter cache holds target features of " + std::to_string(s.draft.seq_len(src)) +
            " (every target decode must be passed to target_decoded)");
  s.draft.seq_fork(src, dst, n);
}

void DflashDrafter::target_decoded(const Batch& batch) {
  Impl& s = *impl_;
  const size_t n = batch.size();
  check(n <= size_t(s.n_rows), "dflash: a target batch of " + std::to_string(n) +
                                   " rows exceeds the feature "
                                   "buffer of " +
                                   std::to_string(s.n_rows) + " rows (the target's n_batch)");
  // Each sequence's drafter cache continues at the first position of its rows in this batch: what lies
  // beyond (features of rejected drafts) goes.
  std::map<int32_t, int32_t> first;
  for (size_t r = 0; r < n; ++r) first.emplace(batch.seq_ids[r], batch.positions[r]);
  for (const auto& [seq, p0] : first) {
    const int32_t have = s.draft.seq_len(seq);
    check(have >= p0, "dflash: sequence " + std::to_string(seq) + " has target features up to position " +
                          std::to_string(have) + " but the target batch starts at " + std::to_string(p0) +
                          " (every target decode must be passed to target_decoded)");
    if (have > p0) s.draft.seq_remove(seq, p0);
  }
  Batch fb;
  if (s.device) {
    for (size_t r = 0; r < n; ++r)
      fb.add(kNoToken, batch.positions[r], batch.seq_ids[r], false, true, int32_t(r));
    fb.embedding_source =
        EmbeddingSource{s.draft_device, s.features.data(), s.n_rows, s.row_floats() * sizeof(float)};
    if (Event* written = s.target.taps_written()) written->wait(*s.draft_stream);
    s.draft.decode(fb);
    s.read->record(*s.draft_stream);  // the target's next decode waits for it before overwriting
    return;
  }
  s.target.synchronize();  // taps into host memory are complete after it
  const size_t E = size_t(s.n_embd), K = s.info.target_layers.size();
  fb.embeddings.resize(n * K * E);
  for (size_t r = 0; r < n; ++r) {
    const float* row = s.host_taps.data() + r * K * E;
    for (size_t k = 0; k < K; ++k)  // file order: [tap(target_layers[0]) | tap(target_layers[1]) | ...]
      std::copy_n(row + s.tap_of[k] * E, E, fb.embeddings.data() + (r * K + k) * E);
  }
  for (size_t r = 0; r < n; ++r)
    fb.add(kNoToken, batch.positions[r], batch.seq_ids[r], false, true, int32_t(r));
  s.draft.decode(fb);
}

void DflashDrafter::draft(std::span<const int32_t> seqs, std::span<const std::vector<int32_t>* const> history,
                          std::span<const int32_t> n_max, std::span<const SamplingParams> sampling,
                          float p_min, std::vector<Draft>& out) {
  Impl& s = *impl_;
  out.assign(seqs.size(), {});
  Batch batch;
  batch.mask.kind = AttentionMask::BlockBidirectional;
  batch.mask.block_size = 0;  // a sequence's rows form one block
  std::vector<size_t> row0(seqs.size(), 0);
  std::vector<int32_t> len(seqs.size(), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<int32_t>& h = *history[i];
    const int32_t n = std::min(n_max[i], s.info.block_size - 1);
    if (n <= 0 || h.empty()) continue;
    const int32_t seq = seqs[i], n_past = int32_t(h.size()) - 1;
    const int32_t have = s.draft.seq_len(seq);
    check(have >= n_past, "dflash: sequence " + std::to_string(seq) + " has target features up to position " +
                              std::to_string(have) + ", the history needs " + std::to_string(n_past));
    if (have > n_past) s.draft.seq_remove(seq, n_past);  // features of rejected drafts
    if (!sampling[i].greedy()) {
      if (s.samplers.size() <= size_t(seq)) s.samplers.resize(size_t(seq) + 1);
      if (!s.samplers[size_t(seq)])
        s.samplers[size_t(seq)] = std::make_unique<Sampler>(draft_sampling(sampling[i], kDflashStream));
    }
    row0[i] = batch.size();
    len[i] = n;
    batch.add(h.back(), n_past, seq, false, false);
    for (int32_t j = 1; j <= n; ++j) batch.add(s.info.mask_token_id, n_past + j, seq, true, false);
  }
  if (batch.empty()) return;
  check(int64_t(batch.size()) <= s.draft.params().n_batch,
        "dflash: the draft blocks of " + std::to_string(seqs.size()) + " sequences need " +
            std::to_string(batch.size()) + " rows in one pass, the drafter's session has n_batch " +
            std::to_string(s.draft.params().n_batch));
  s.draft.decode(batch);
  const auto to_target = [&](int32_t id) { return s.info.d2t.empty() ? id : s.info.d2t[size_t(id)]; };
  // Greedy drafts without a probability floor: argmax on the device, only the ids come back (a large
  // vocabulary's logits would otherwise cross to the host every cycle).
  std::vector<size_t> dev_rows;
  for (size_t i = 0; i < seqs.size(); ++i)
    if (sampling[i].greedy() && p_min <= 0.0f)
      for (int32_t j = 1; j <= len[i]; ++j) dev_rows.push_back(row0[i] + size_t(j));
  std::vector<int32_t> dev_ids;
  if (!dev_rows.empty()) {
    SamplingParams g;
    g.temperature = 0.0f;
    if (!s.greedy) s.greedy = std::make_unique<Sampler>(g);
    std::vector<Sampler*> smp(dev_rows.size(), s.greedy.get());
    dev_ids = s.draft.sample(dev_rows, smp);
  }
  size_t next_dev = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Draft& d = out[i];
    if (sampling[i].greedy() && p_min <= 0.0f) {
      for (int32_t j = 1; j <= len[i]; ++j) d.tokens.push_back(to_target(dev_ids[next_dev++]));
      continue;
    }
    for (int32_t j = 1; j <= len[i]; ++j) {
      const std::span<const float> logits = s.draft.logits(row0[i] + size_t(j));
      int32_t token;
      double prob = 1.0;
      if (sampling[i].greedy()) {
        token = argmax(logits);
        if (p_min > 0.0f) prob = top_probability(logits);
        if (prob < p_min) break;
      } else {
        Sampler& smp = *s.samplers[size_t(seqs[i])];
        token = smp.sample(logits);
        const auto cand = smp.last_candidates();
        prob = 0.0;
        for (const TokenCandidate& t : cand)
          if (t.id == token) prob = t.p;
        if (prob < p_min) break;
        std::vector<TokenCandidate> q(cand.begin(), cand.end());
        for (TokenCandidate& t : q) t.id = to_target(t.id);
        d.q.push_back(std::move(q));
      }
      d.tokens.push_back(to_target(token));
    }
  }
}

}  // namespace tandem
