// Row split (--split-mode row, llama.cpp's older mode): every matrix is cut by output rows over the mesh's
// devices in the --tensor-split ratios; everything else (norms, embeddings, attention, the KV cache) stays on
// the main device. A product y = W x runs as: x is copied from the main device to every other device, each
// device multiplies its row slice, and the slices are copied back into y's rows on the main device.
//
// The model code does not change for this mode: the weight loader hands it, for each matrix, a handle from
// RowSplitWeights (the full shape, on the main device), and the session runs the model with RowSplitOps, an
// Ops that forwards every op to the main device's Ops except matmul on a handle, which it distributes.
#pragma once

#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_ops.h"
#include "parallel/shard_rules.h"

namespace tandem {

class RowSplitWeights {
 public:
  struct Entry {
    std::string name;
    int64_t n_rows = 0;          // the matrix's output rows
    std::vector<Range> rows;     // per device
    std::vector<Tensor> shards;  // per device; data == nullptr where the slice is empty
  };

  // devices[d] hold slice d (the Device objects must outlive this); main: index of the main device.
  RowSplitWeights(std::vector<Device*> devices, int main, std::vector<double> ratios);

  // Places the row slices of the host matrix `host` ({in, out}, any weight dtype, rows may be strided) on
  // every device and returns the handle the model keeps: host's shape and dtype, device = the main device,
  // data = this registry's entry. The handle is only ever passed to RowSplitOps::matmul, never read as
  // memory.
  Tensor add(const Tensor& host, const std::string& name);
  // The entry of a handle, or null when t is not one.
  const Entry* find(const Tensor& t) const;

  const std::vector<Device*>& devices() const { return devices_; }
  int main() const { return main_; }
  // Largest slice (rows) on device d over every matrix.
  int64_t max_rows_on(size_t d) const { return max_rows_.at(d); }

 private:
  std::vector<Device*> devices_;
  int main_;
  std::vector<double> ratios_;
  std::deque<Entry> entries_;
  std::set<const void*> handles_;  // the entries' addresses: a handle's data is one of them
  std::deque<Buffer> buffers_;
  std::vector<int64_t> max_rows_;
};

// The Ops of a row-split model: main's Ops for everything (ForwardingOps), matmul on a RowSplitWeights handle
// distributed.
// Other devices work on streams of this object's own (one per peer), ordered against the main stream by
// events, so two RowSplitOps of one model (one per session) never share buffers, streams or events.
class RowSplitOps final : public ForwardingOps {
 public:
  explicit RowSplitOps(const RowSplitWeights& weights);
  ~RowSplitOps() override;

  void reserve(const WorkspacePlan& plan) override;
  void set_batch_invariant(bool on) override;  // on every device's ops (the peers run matmul slices)
  void matmul(Stream& s, const Tensor& W, const Tensor& x, const Tensor& y) override;

 private:
  Ops& main_ops() const { return weights_.devices()[size_t(weights_.main())]->ops(); }

  struct Peer {
    Buffer x, y;    // on the peer device: the copied input and its slice of the product
    Buffer y_main;  // on the main device: the slice copied back
    std::unique_ptr<Event> input_ready, slice_ready;
    std::unique_ptr<Stream> stream;  // on the peer device
  };
  const RowSplitWeights& weights_;
  std::vector<Peer> peers_;  // per device (the main device's entry is unused)
  int64_t max_in_ = 0, max_rows_ = 0;
};

}  // namespace tandem
