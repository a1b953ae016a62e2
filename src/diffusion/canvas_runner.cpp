// The model side of canvas diffusion (include/tandem/diffusion.h): a CanvasSource over a Session of a
// diffusion-gemma model, running the phases of GGUF-ARCH-FACTS D.4 on the step seam:
//   PREFILL  begin_block: the prefix once, causal, writing K/V into the session's cache (the prompt-KV store:
//            it lives with each layer, on that layer's device, under any split); logits of its last row only;
//   DECODE   forward: the canvas at positions P.., kv_write = 0, PrefixRegion(P): every canvas row sees the
//            cached prompt (from P - window + 1 on sliding layers) and every canvas row; the cache is
//            unchanged;
//   UNIFIED  forward without the cache: [prefix | canvas] in one batch, kv_write = 0, PrefixRegion(P).
// Self-conditioning (D.5) enters as the canvas rows' added embedding rows (Batch::embd_rows): computed on the
// device from the persistent logits buffer (DeviceSelfCond, on the first rank's device, where the embedding
// reads its rows) or on the host (HostSelfCond). A block's first step passes use_sc = false (no rows added).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "core/env_switch.h"
#include "core/error.h"
#include "diffusion/canvas_sc.h"
#include "model/diffusion_gemma.h"
#include "model/model_impl.h"
#include "runtime/session_impl.h"
#include "tandem/diffusion.h"

namespace tandem {

namespace {

enum class ScPath { Off, Host, Device };

// TANDEM_CANVAS_KV_F16 (on; =0 keeps F32): CanvasOptions::kv_type unset picks F16 on a GPU for weights that are
// not F32 (below), so DECODE's canvas rows take the tensor-core attention. On since the twelfth session's GPU run
// (H100, 26B-A4B shape at 6 layers, bf16: 22.5 -> 13.6 ms a denoising step with the switches of that run).
EnvSwitch g_canvas_kv_f16{"TANDEM_CANVAS_KV_F16", true};

// CanvasOptions::kv_type unset: F32 as the reference keeps it, unless (TANDEM_CANVAS_KV_F16) the first layer's
// query weights are not F32 and the model runs on a GPU: there an F16 store lets the canvas rows' attention take
// the tensor-core kernel (a bf16 or quantized model's K/V carry no more precision than F16 keeps).
KvType auto_kv_type(const Model::Impl& m) {
  const gguf::TensorInfo* q = m.file->find_tensor("blk.0.attn_q.weight");
  const bool on_gpu = m.ranks.front().device->id().kind != DeviceKind::CPU;
  return g_canvas_kv_f16.on() && on_gpu && q != nullptr && q->type != DType::F32 ? KvType::F16 : KvType::F32;
}

class CanvasRunner : public CanvasSource {
 public:
  CanvasRunner(std::shared_ptr<Model> model, const CanvasOptions& opt) : model_(std::move(model)), opt_(opt) {
    info_ = canvas_model_info(*model_);
    const Model::Impl& m = model_->impl();
    const ModelHparams& hp = m.decoder().hparams();
    C_ = info_.canvas_length;
    E_ = hp.n_embd;
    V_ = hp.n_vocab;
    check(opt_.max_prompt >= 0 && opt_.max_prompt <= 1 << 20,
          "canvas: max_prompt must be in [0, 1048576], got " + std::to_string(opt_.max_prompt));
    kv_cache_ = opt_.kv_cache != Toggle::Off;

    SessionParams sp;
    sp.n_seq_max = 1;
    sp.n_ctx = opt_.max_prompt + C_;
    // UNIFIED needs [prefix | canvas] in one forward pass; PREFILL may run in chunks, DECODE is the canvas.
    sp.n_batch = kv_cache_ ? std::max(C_, std::min(opt_.max_prompt, 512)) : opt_.max_prompt + C_;
    sp.n_logits_max = C_;
    kv_type_ = opt_.kv_type ? *opt_.kv_type : auto_kv_type(m);
    sp.kv_type = kv_type_;
    session_ = std::make_unique<Session>(model_, sp);
    host_logits_.assign(size_t(V_ * C_), 0.0f);

    // Self-conditioning: where it runs.
    const SelfCondWeights* w = diffusion_gemma_self_cond(*m.ranks.front().decoder);
    if (!opt_.self_conditioning) {
      sc_ = ScPath::Off;
    } else {
      check(w != nullptr, m.file->path() +
                              ": self-conditioning needs the self_cond_* tensors, which this model lacks "
                              "(turn self-conditioning off)");
      Device& first = *m.ranks.front().device;
      const bool on_gpu = first.id().kind != DeviceKind::CPU;
      const bool want_device =
          opt_.gpu_sampling == Toggle::On || (opt_.gpu_sampling == Toggle::Auto && on_gpu);
      sc_ = ScPath::Host;
      if (want_device) {
        try {
          dev_sc_ = std::make_unique<DeviceSelfCond>(first, *m.file, *w, E_, V_, C_, hp.rms_eps);
          sc_ = ScPath::Device;
        } catch (const Error& e) {
          std::fprintf(stderr,
                       "tandem: warning: self-conditioning buffers do not fit on %s (%s); using the "
                       "host path\n",
                       first.id().to_string().c_str(), e.what());
        }
      }
      if (sc_ == ScPath::Host) host_sc_ = std::make_unique<HostSelfCond>(*m.file, E_, V_, hp.rms_eps);
    }
    sc_host_rows_.assign(size_t(E_ * C_), 0.0f);
  }

  const CanvasModelInfo& info() const override { return info_; }

  void begin_block(std::span<const int32_t> prefix) override {
    check(int64_t(prefix.size()) <= opt_.max_prompt,
          "the prompt has " + std::to_string(prefix.size()) + " tokens, more than the " +
              std::to_string(opt_.max_prompt) +
              " this canvas runner was made for (CanvasOptions::max_prompt)");
    for (int32_t t : prefix)
      check(t >= 0 && t < V_,
            "prompt token " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(V_));
    prefix_.assign(prefix.begin(), prefix.end());
    session_->clear();
    if (kv_cache_ && !prefix_.empty()) {
      Batch b;
      b.add_sequence(prefix_, 0, 0, /*last_logits*/ true);  // PREFILL: causal, writes K/V
      session_->decode(b);
    }
    if (dev_sc_) dev_sc_->reset(sc_stream());
    std::fill(host_logits_.begin(), host_logits_.end(), 0.0f);
    steps_ = 0;
  }

  const Tensor& forward(std::span<const int32_t> canvas, bool use_sc, float sc_temp_inv) override {
    check(int64_t(canvas.size()) == C_, "the canvas has " + std::to_string(canvas.size()) +
                                            " tokens; this model's canvas_length is " + std::to_string(C_));
    check(std::isfinite(sc_temp_inv) && sc_temp_inv > 0.0f, "sc_temp_inv must be finite and > 0");
    const int32_t P = int32_t(prefix_.size());
    const bool sc = sc_ != ScPath::Off && use_sc;
    Batch b;
    b.mask.kind = AttentionMask::PrefixRegion;
    b.mask.prefix_len = P;
    if (!kv_cache_)  // UNIFIED: the prefix rows ride along, attending causally, writing nothing
      for (int32_t i = 0; i < P; ++i) b.add(prefix_[size_t(i)], i, 0, false, false);
    for (int32_t i = 0; i < C_; ++i) b.add(canvas[size_t(i)], P + i, 0, true, false, sc ? i : -1);
    if (sc && sc_ == ScPath::Device) {
      dev_sc_->compute(sc_stream(), sc_temp_inv);
      order_ranks_after_sc();
      b.embedding_source = EmbeddingSource{dev_sc_->device().id(), dev_sc_->rows().data, C_, 0};
    } else if (sc) {
      host_sc_->compute(host_logits_, C_, sc_temp_inv, sc_host_rows_);
      b.embeddings = sc_host_rows_;
    }
    session_->decode(b);
    ++steps_;
    if (dev_sc_) {
      keep_device_logits();
      result_ = dev_sc_->logits();
    } else {
      session_->fetch_all_logits();
      const size_t first = kv_cache_ ? 0 : size_t(P);
      for (int32_t i = 0; i < C_; ++i) {
        const std::span<const float> l = session_->logits(first + size_t(i));
        std::copy(l.begin(), l.end(), host_logits_.begin() + ptrdiff_t(i) * V_);
      }
      result_ = Tensor::contiguous(DType::F32, {V_, C_}, host_logits_.data(), DeviceId{});
    }
    return result_;
  }

  void set_sc_logits(std::span<const float> logits) override {
    check(sc_ != ScPath::Off, "set_sc_logits: self-conditioning is off for this canvas source");
    check(int64_t(logits.size()) == V_ * C_, "set_sc_logits: " + std::to_string(logits.size()) +
                                                 " values; the canvas needs " + std::to_string(V_ * C_) +
                                                 " (canvas_length x n_vocab)");
    if (dev_sc_) {
      Device& d = dev_sc_->device();
      d.synchronize();  // the last step's copy into the buffer may be in flight on the output rank's stream
      d.copy_from_host(sc_stream(), dev_sc_->logits().data, logits.data(), logits.size() * sizeof(float));
      sc_stream().synchronize();  // `logits` may be freed on return
    } else {
      std::copy(logits.begin(), logits.end(), host_logits_.begin());
    }
  }

  // The device sampler reads the logits where they are: the SC buffer's device (its default stream, which the
  // step's copy into the buffer is ordered on), or the host when SC runs there.
  Device* logits_device() const override { return dev_sc_ ? &dev_sc_->device() : nullptr; }

  std::string describe() const override {
    std::string s = "canvas " + std::to_string(C_) + ": prompt KV cache " +
                    (kv_cache_ ? "on (PREFILL once, DECODE per step)" : "off (UNIFIED per step)") + ", K/V " +
                    dtype_name(kv_dtype(kv_type_)) + "; self-conditioning ";
    switch (sc_) {
      case ScPath::Off:
        s += "off";
        break;
      case ScPath::Host:
        s += "on the host";
        break;
      case ScPath::Device:
        s += "on " + dev_sc_->device().id().to_string();
        break;
    }
    return s;
  }

 private:
  Stream& sc_stream() const { return dev_sc_->device().default_stream(); }

  // Each rank reads the SC rows on its own device's stream. A rank of another Device object (tensor split
  // over ranks sharing a GPU, layer split) is not ordered after the compute by stream order: make it wait for
  // it. (Without this the H200 runs of 2026-12-04 saw tensor-split steps with SC read half-written rows.)
  void order_ranks_after_sc() {
    bool recorded = false;
    for (const auto& r : session_->impl().ranks) {
      if (&r->stream == &sc_stream()) continue;
      if (!recorded) {
        if (!sc_ready_) sc_ready_ = dev_sc_->device().create_event();
        sc_ready_->record(sc_stream());
        recorded = true;
      }
      sc_ready_->wait(r->stream);
    }
  }

  // The step's canvas logits into the persistent buffer the next step's SC reads (and the sampler reads).
  void keep_device_logits() {
    Session::Impl& s = session_->impl();
    const Tensor L = session_->device_logits();  // {V, C}: the canvas rows are the only marked rows
    RankState& out = s.output_rank();
    Device& dst = dev_sc_->device();
    const size_t bytes = size_t(V_) * size_t(C_) * sizeof(float);
    if (&out.device == &dst) {
      dst.copy_device_to_device(out.stream, dev_sc_->logits().data, L.data, bytes);
    } else {  // layer split: the output layer's device is not the first rank's
      copy_between_devices(out.stream, dst, dev_sc_->logits().data, out.device, L.data, bytes);
      if (!copied_) copied_ = out.device.create_event();
      copied_->record(out.stream);
      copied_->wait(sc_stream());
    }
  }

  std::shared_ptr<Model> model_;
  CanvasOptions opt_;
  CanvasModelInfo info_;
  int32_t C_ = 0;
  int64_t E_ = 0, V_ = 0;
  bool kv_cache_ = true;
  KvType kv_type_ = KvType::F32;  // the session's K/V store (CanvasOptions::kv_type, or auto_kv_type)
  ScPath sc_ = ScPath::Off;
  std::unique_ptr<Session> session_;
  std::unique_ptr<DeviceSelfCond> dev_sc_;
  std::unique_ptr<HostSelfCond> host_sc_;
  std::unique_ptr<Event> copied_;
  std::unique_ptr<Event> sc_ready_;  // SC rows computed: the other ranks' streams wait for it
  std::vector<int32_t> prefix_;
  std::vector<float> host_logits_;   // host path: the last step's canvas logits, C rows of n_vocab
  std::vector<float> sc_host_rows_;  // host path: the SC rows of this step, C rows of n_embd
  Tensor result_;
  int64_t steps_ = 0;
};

}  // namespace

void CanvasSource::set_sc_logits(std::span<const float>) {
  throw Error("this canvas source takes no self-conditioning logits");
}

std::unique_ptr<CanvasSource> make_canvas_source(std::shared_ptr<Model> model, const CanvasOptions& options) {
  check(model != nullptr, "make_canvas_source: no model");
  return std::make_unique<CanvasRunner>(std::move(model), options);
}

}  // namespace tandem
