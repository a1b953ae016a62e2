#include "runtime/kv_storage.h"

#include "core/error.h"

namespace tandem {

namespace {

void check_kv_type(DType t) {
  check(t == DType::F32 || t == DType::F16 || t == DType::BF16,
        std::string("KV cache type must be f32, f16 or bf16, got ") + dtype_name(t));
}

}  // namespace

size_t KvStorage::bytes_per_position(std::span<const KvLayerShape> layers, DType type_k, DType type_v) {
  size_t n = 0;
  for (const KvLayerShape& l : layers)
    n += dtype_row_bytes(type_k, l.head_dim_k * l.n_kv_head) +
         dtype_row_bytes(type_v, l.head_dim_v * l.n_kv_head);
  return n;
}

KvStorage::KvStorage(Device& device, std::span<const KvLayerShape> layers, DType type_k, DType type_v,
                     int32_t n_blocks, int32_t block_size)
    : device_(device) {
  check_kv_type(type_k);
  check_kv_type(type_v);
  check(n_blocks >= 1 && block_size >= 1, "KV cache needs at least one block of at least one position");
  for (const KvLayerShape& l : layers) {
    KvLayerView view;
    view.block_size = block_size;
    const size_t k_bytes =
        dtype_row_bytes(type_k, l.head_dim_k * l.n_kv_head) * size_t(block_size) * size_t(n_blocks);
    const size_t v_bytes =
        dtype_row_bytes(type_v, l.head_dim_v * l.n_kv_head) * size_t(block_size) * size_t(n_blocks);
    void* k_data =
        buffers_.emplace_back(device.allocate(k_bytes)).data();  // (the vector may move Buffers, not
    void* v_data = buffers_.emplace_back(device.allocate(v_bytes)).data();  // the memory they own)
    view.k =
        Tensor::contiguous(type_k, {l.head_dim_k, l.n_kv_head, block_size, n_blocks}, k_data, device.id());
    view.v =
        Tensor::contiguous(type_v, {l.head_dim_v, l.n_kv_head, block_size, n_blocks}, v_data, device.id());
    views_.push_back(view);
    bytes_ += k_bytes + v_bytes;
  }
}

void KvStorage::apply_copies(Stream& stream, std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    for (const KvLayerView& l : views_) {
      for (const Tensor* t : {&l.k, &l.v}) {
        char* base = static_cast<char*>(t->data);
        device_.copy_device_to_device(stream, base + size_t(c.dst_block) * t->nb[3],
                                      base + size_t(c.src_block) * t->nb[3],
                                      size_t(c.n_positions) * t->nb[2]);
      }
    }
  }
}

}  // namespace tandem
