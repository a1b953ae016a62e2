// The EB sampler's randomness, per-step decision and loop (eb_sampler.h, GGUF-ARCH-FACTS D.6).
#include "diffusion/eb_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/backend.h"
#include "core/error.h"
#include "diffusion/eb_reduce.h"

namespace tandem {

void check_eb_params(const EbParams& p) {
  check(p.max_steps >= 1 && p.max_steps <= 100000,
        "diffusion: max_steps must be in [1, 100000], got " + std::to_string(p.max_steps));
  check(std::isfinite(p.t_min) && std::isfinite(p.t_max) && p.t_min >= 0.0f && p.t_max > p.t_min,
        "diffusion: the temperatures must satisfy 0 <= t_min < t_max (finite), got t_min " +
            std::to_string(p.t_min) + ", t_max " + std::to_string(p.t_max));
  check(std::isfinite(p.entropy_bound) && p.entropy_bound > 0.0f,
        "diffusion: entropy_bound must be a finite number > 0, got " + std::to_string(p.entropy_bound));
  check(p.stability_threshold >= 0,
        "diffusion: stability_threshold must be >= 0, got " + std::to_string(p.stability_threshold));
  check(std::isfinite(p.confidence_threshold) && p.confidence_threshold > 0.0f,
        "diffusion: confidence_threshold must be a finite number > 0, got " +
            std::to_string(p.confidence_threshold));
}

namespace diffusion {

float eb_temperature(const EbParams& p, int32_t cur_step) {
  const double t_min = p.t_min, t_max = p.t_max;
  return float(t_min + (t_max - t_min) * double(cur_step) / double(p.max_steps));
}

EbRandom::EbRandom(uint32_t seed, int32_t n_vocab) : gen_(seed), token_(0, n_vocab - 1), unit_(0.0f, 1.0f) {
  check(n_vocab >= 1, "diffusion: the vocabulary is empty");
}

std::vector<int32_t> EbRandom::initial_canvas(int32_t canvas_length) {
  std::vector<int32_t> canvas(static_cast<size_t>(canvas_length));
  for (int32_t& t : canvas) t = token_(gen_);
  return canvas;
}

void EbRandom::draw_step(std::span<float> u, std::span<int32_t> renoise) {
  check(u.size() == renoise.size(), "diffusion: u and renoise differ in length");
  // Interleaved per position, single-threaded: the order is part of the output (D.6 e).
  for (size_t i = 0; i < u.size(); ++i) {
    u[i] = unit_(gen_);
    renoise[i] = token_(gen_);
  }
}

EbDecision eb_decide(std::span<const EbRowStats> rows, std::span<const int32_t> renoise,
                     std::span<const int32_t> prev_argmax, int32_t held, const EbParams& p) {
  const size_t n = rows.size();
  check(n > 0 && renoise.size() == n && prev_argmax.size() == n,
        "diffusion: one step needs one row, renoise draw and previous argmax per canvas position");
  EbDecision d;
  d.next_canvas.resize(n);
  d.argmax.resize(n);
  d.accepted.assign(n, 0);

  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return rows[a].entropy < rows[b].entropy || (rows[a].entropy == rows[b].entropy && a < b);
  });
  // Strict prefix bound: a position is accepted when the entropies of the positions before it (in the
  // sorted order) sum to at most the bound. Entropies are >= 0, so the accepted set is a prefix of the order.
  double before = 0.0;
  for (uint32_t i : order) {
    if (before > double(p.entropy_bound)) break;
    d.accepted[i] = 1;
    ++d.n_accepted;
    before += double(rows[i].entropy);
  }

  double entropy_sum = 0.0;
  bool same = true;
  for (size_t i = 0; i < n; ++i) {
    d.next_canvas[i] = d.accepted[i] ? rows[i].sampled : renoise[i];
    d.argmax[i] = rows[i].argmax;
    entropy_sum += double(rows[i].entropy);
    same = same && rows[i].argmax == prev_argmax[i];
  }
  d.mean_entropy = entropy_sum / double(n);
  d.held = same ? held + 1 : 0;
  d.stable = d.held >= p.stability_threshold;
  d.confident = d.mean_entropy < double(p.confidence_threshold);
  d.stop = d.stable && d.confident;
  return d;
}

namespace {

// The logits forward() returned, checked against the contract (diffusion.h).
void check_logits(const Tensor& logits, const CanvasModelInfo& info) {
  check(logits.type == DType::F32 && logits.data != nullptr,
        "diffusion: the canvas source returned logits that are not F32 (or no data)");
  check(logits.ne[0] == info.n_vocab && logits.ne[1] >= info.canvas_length && logits.ne[2] == 1 &&
            logits.ne[3] == 1,
        "diffusion: the canvas logits must be {n_vocab = " + std::to_string(info.n_vocab) +
            ", >= canvas_length = " + std::to_string(info.canvas_length) + "}, got " + logits.shape_string());
  check(logits.nb[0] == sizeof(float) && logits.nb[1] >= logits.row_bytes(),
        "diffusion: the canvas logits' rows must be contiguous");
}

}  // namespace

EbBlockRun run_eb_block(CanvasSource& source, EbReducer& reducer, const EbParams& p, int32_t block,
                        const DiffusionStepCallback& on_step) {
  const CanvasModelInfo& info = source.info();
  const int32_t C = info.canvas_length, S = p.max_steps;
  EbRandom rng(p.seed, info.n_vocab);
  EbBlockRun run;
  std::vector<int32_t> canvas = rng.initial_canvas(C);
  std::vector<int32_t> prev_argmax(size_t(C), -1);
  std::vector<float> u(static_cast<size_t>(C));
  std::vector<int32_t> renoise(static_cast<size_t>(C));
  std::vector<EbRowStats> rows(static_cast<size_t>(C));
  std::vector<float> entropy;  // the rows' fields as arrays, for the callback
  std::vector<int32_t> sampled;
  int32_t held = 0;
  float prev_temp_inv = 1.0f;
  run.canvas = canvas;  // replaced by the first step's argmax canvas
  for (int32_t cur_step = S; cur_step >= 1; --cur_step) {
    const int32_t step_idx = S - cur_step;
    const float temperature = eb_temperature(p, cur_step);
    const float temp_inv = 1.0f / temperature;
    // Self-conditioning reads the previous step's logits at the previous step's 1/t; none on step 0.
    // (A named span, not a temporary: a reference bound to a call with a temporary argument trips GCC 13's
    // -Wdangling-reference.)
    const std::span<const int32_t> input(canvas);
    const Tensor& logits = source.forward(input, step_idx > 0, prev_temp_inv);
    check_logits(logits, info);
    rng.draw_step(u, renoise);
    reducer.reduce(logits, source.logits_device(), temp_inv, u, rows);
    run.device_reduce = run.device_reduce || reducer.last_on_device();
    EbDecision d = eb_decide(rows, renoise, prev_argmax, held, p);
    ++run.steps;
    bool go_on = true;
    if (on_step) {
      DiffusionStep s;
      s.block = block;
      s.step = step_idx;
      s.max_steps = S;
      s.temperature = temperature;
      s.n_accepted = d.n_accepted;
      s.mean_entropy = d.mean_entropy;
      s.stable = d.stable;
      s.confident = d.confident;
      s.device_reduce = reducer.last_on_device();
      s.canvas = canvas;
      s.argmax = d.argmax;
      entropy.resize(rows.size());
      sampled.resize(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        entropy[i] = rows[i].entropy;
        sampled[i] = rows[i].sampled;
      }
      s.entropy = entropy;
      s.sampled = sampled;
      s.u = u;
      s.renoise = renoise;
      s.accepted = d.accepted;
      s.next_canvas = d.next_canvas;
      s.held = d.held;
      go_on = on_step(s);
    }
    canvas = std::move(d.next_canvas);
    run.canvas = d.argmax;
    prev_argmax = std::move(d.argmax);
    held = d.held;
    prev_temp_inv = temp_inv;
    if (d.stop) {
      run.converged = true;
      break;
    }
    if (!go_on) break;
  }
  return run;
}

}  // namespace diffusion
}  // namespace tandem
