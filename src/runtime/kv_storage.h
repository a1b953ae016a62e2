// Device memory of the paged KV cache: one K and one V tensor per layer, {head_dim, n_kv_head, block_size,
// n_blocks} each (the KvLayerView layout of backend/backend.h). The bookkeeping of which sequence owns which
// block is KvCacheTable (runtime/kv_cache.h); the storage only applies its copy-on-write block copies.
//
// With a split across devices, each device holds a KvStorage of its own layers (layer split) or of its share
// of the KV heads (tensor split), all following one KvCacheTable.
#pragma once

#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"
#include "runtime/kv_cache.h"

namespace tandem {

class KvStorage {
 public:
  // Allocates every layer's K/V on `device`. type_k / type_v: F32, F16 or BF16.
  KvStorage(Device& device, std::span<const KvLayerShape> layers, DType type_k, DType type_v,
            int32_t n_blocks, int32_t block_size);

  std::span<const KvLayerView> layers() const { return views_; }
  const KvLayerView& layer(size_t i) const { return views_.at(i); }
  size_t bytes() const { return bytes_; }

  // Copies the first n_positions slots of src_block into dst_block in every layer, on `stream`.
  void apply_copies(Stream& stream, std::span<const BlockCopy> copies);

  // Bytes one position takes over all layers (to size a cache from a memory budget or report it).
  static size_t bytes_per_position(std::span<const KvLayerShape> layers, DType type_k, DType type_v);

 private:
  Device& device_;
  std::vector<Buffer> buffers_;
  std::vector<KvLayerView> views_;
  size_t bytes_ = 0;
};

}  // namespace tandem
