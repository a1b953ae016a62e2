#include "parallel/row_split.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

RowSplitWeights::RowSplitWeights(std::vector<Device*> devices, int main, std::vector<double> ratios)
    : devices_(std::move(devices)), main_(main), ratios_(std::move(ratios)) {
  check(
      !devices_.empty() && main_ >= 0 && size_t(main_) < devices_.size() && ratios_.size() == devices_.size(),
      "row split: bad device list");
  max_rows_.assign(devices_.size(), 0);
}

Tensor RowSplitWeights::add(const Tensor& host, const std::string& name) {
  Entry& e = entries_.emplace_back();
  e.name = name;
  e.n_rows = host.ne[1];
  e.rows = split_range(host.ne[1], ratios_);
  const size_t row_bytes = host.row_bytes();
  for (size_t d = 0; d < devices_.size(); ++d) {
    const Range r = e.rows[d];
    Tensor shard = host;
    shard.ne[1] = r.size();
    shard.nb[2] = shard.nb[3] = shard.nb[1] * size_t(r.size());
    shard.device = devices_[d]->id();
    if (r.size() == 0) {
      shard.data = nullptr;
    } else if (devices_[d]->id().kind == DeviceKind::CPU) {
      shard.data = static_cast<char*>(host.data) + size_t(r.begin) * host.nb[1];  // a view into the mapping
    } else {
      Device& dev = *devices_[d];
      const size_t bytes = row_bytes * size_t(r.size());
      Buffer& b = buffers_.emplace_back(dev.allocate(bytes));
      Stream& st = dev.default_stream();
      dev.copy_2d(st, b.data(), row_bytes, static_cast<const char*>(host.data) + size_t(r.begin) * host.nb[1],
                  host.nb[1], row_bytes, size_t(r.size()), CopyKind::HostToDevice);
      st.synchronize();
      shard = Tensor::contiguous(host.type, {host.ne[0], r.size()}, b.data(), dev.id());
    }
    e.shards.push_back(shard);
    max_rows_[d] = std::max(max_rows_[d], r.size());
  }
  Tensor handle = Tensor::contiguous(host.type, {host.ne[0], host.ne[1]}, &e, devices_[size_t(main_)]->id());
  handles_.insert(&e);
  return handle;
}

const RowSplitWeights::Entry* RowSplitWeights::find(const Tensor& t) const {
  return handles_.count(t.data) ? static_cast<const Entry*>(t.data) : nullptr;
}

RowSplitOps::RowSplitOps(const RowSplitWeights& weights)
    : ForwardingOps(weights.devices()[size_t(weights.main())]->ops()), weights_(weights) {
  peers_.resize(weights_.devices().size());
  for (size_t d = 0; d < peers_.size(); ++d) {
    if (int(d) == weights_.main()) continue;
    peers_[d].input_ready = weights_.devices()[size_t(weights_.main())]->create_event();
    peers_[d].slice_ready = weights_.devices()[d]->create_event();
    peers_[d].stream = weights_.devices()[d]->create_stream();
  }
}

RowSplitOps::~RowSplitOps() {
  for (Peer& p : peers_)  // the buffers go with this object: let the peers' work on them finish first
    if (p.stream) p.stream->synchronize();
}

void RowSplitOps::reserve(const WorkspacePlan& plan) {
  main_ops().reserve(plan);
  Device& main = *weights_.devices()[size_t(weights_.main())];
  if (plan.max_matmul_in <= max_in_ && plan.max_rows <= max_rows_) return;
  max_in_ = std::max(max_in_, plan.max_matmul_in);
  max_rows_ = std::max(max_rows_, plan.max_rows);
  for (size_t d = 0; d < peers_.size(); ++d) {
    if (int(d) == weights_.main()) continue;
    Device& dev = *weights_.devices()[d];
    dev.ops().reserve(plan);
    const size_t y_bytes = size_t(std::max<int64_t>(weights_.max_rows_on(d), 1)) * size_t(max_rows_) * 4;
    peers_[d].x = dev.allocate(size_t(std::max<int64_t>(max_in_, 1)) * size_t(max_rows_) * 4);
    peers_[d].y = dev.allocate(y_bytes);
    peers_[d].y_main = main.allocate(y_bytes);
  }
}

void RowSplitOps::set_batch_invariant(bool on) {
  for (Device* d : weights_.devices()) d->ops().set_batch_invariant(on);
}

void RowSplitOps::matmul(Stream& s, const Tensor& W, const Tensor& x, const Tensor& y) {
  const RowSplitWeights::Entry* e = weights_.find(W);
  if (!e) {
    main_ops().matmul(s, W, x, y);
    return;
  }
  const int64_t T = x.ne[1], in = x.ne[0];
  check(
      x.type == DType::F32 && x.is_contiguous() && x.ne[2] == 1 && x.ne[3] == 1 && in == W.ne[0],
      "row split matmul of " + e->name + ": x must be a contiguous F32 {" + std::to_string(W.ne[0]) + ", T}");
  check(y.ne[0] == e->n_rows && y.ne[1] == T, "row split matmul of " + e->name + ": y has the wrong shape");
  check(T <= max_rows_ && in <= max_in_, "row split matmul of " + e->name + ": " + std::to_string(T) +
                                             " rows of " + std::to_string(in) +
                                             " exceed the reserved workspace");
  const std::vector<Device*>& devs = weights_.devices();
  const size_t main = size_t(weights_.main());
  Device& main_dev = *devs[main];
  auto y_rows = [&](Range r) {  // rows [r.begin, r.end) of y: a strided view
    Tensor v = y;
    v.data = static_cast<char*>(y.data) + size_t(r.begin) * sizeof(float);
    v.ne[0] = r.size();
    return v;
  };
  // Peers first, so they compute while the main device does its own slice.
  for (size_t d = 0; d < devs.size(); ++d) {
    if (d == main || e->rows[d].size() == 0) continue;
    Peer& p = peers_[d];
    Device& dev = *devs[d];
    Stream& ds = *p.stream;
    copy_between_devices(s, dev, p.x.data(), main_dev, x.data, x.nbytes());
    p.input_ready->record(s);
    p.input_ready->wait(ds);
    const Tensor xd = Tensor::contiguous(DType::F32, {in, T}, p.x.data(), dev.id());
    const Tensor yd = Tensor::contiguous(DType::F32, {e->rows[d].size(), T}, p.y.data(), dev.id());
    dev.ops().matmul(ds, e->shards[d], xd, yd);
    copy_between_devices(ds, main_dev, p.y_main.data(), dev, p.y.data(), yd.nbytes());
    p.slice_ready->record(ds);
  }
  if (e->rows[main].size() > 0) main_ops().matmul(s, e->shards[main], x, y_rows(e->rows[main]));
  for (size_t d = 0; d < devs.size(); ++d) {
    if (d == main || e->rows[d].size() == 0) continue;
    Peer& p = peers_[d];
    p.slice_ready->wait(s);
    const Tensor part =
        Tensor::contiguous(DType::F32, {e->rows[d].size(), T}, p.y_main.data(), main_dev.id());
    main_ops().copy(s, part, y_rows(e->rows[d]));
  }
}

}  // namespace tandem
