// The CUDA device: memory, the clear out-of-memory error, staged copies from pageable memory, events across
// streams, and CUDA-graph capture of a decode-like chain of ops (replayed after its device inputs change).
#include <cuda_runtime_api.h>

#include <numeric>

#include "backend/cuda/cuda_device.h"
#include "gpu_test_util.h"

namespace tandem::gpu_test {
namespace {

class GpuDevice : public GpuTest {};

TEST_F(GpuDevice, NameMemoryAndOutOfMemoryError) {
  EXPECT_EQ(gpu_->name().rfind("cuda:0 ", 0), 0u) << gpu_->name();
  EXPECT_GT(gpu_->total_memory(), gpu_->free_memory() / 2);
  try {
    (void)gpu_->allocate(gpu_->total_memory() * 2);
    FAIL() << "allocating twice the device memory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MiB"), std::string::npos) << e.what();
  }
  // The device still works after the failed allocation.
  Buffer b = gpu_->allocate(1024);
  EXPECT_TRUE(bool(b));
  EXPECT_THROW(create_device(DeviceId{DeviceKind::CUDA, 99}), Error);
}

TEST_F(GpuDevice, StagedCopyFromPageableMemoryRoundTrips) {
  const size_t n = (size_t(100) << 20) + 12345;  // several 32 MiB staging chunks and a ragged tail
  std::vector<uint8_t> src(n);
  std::iota(src.begin(), src.end(), uint8_t(7));
  Buffer d = gpu_->allocate(n);
  gpu_->copy_from_host(gs(), d.data(), src.data(), n);
  std::vector<uint8_t> back(n, 0);
  Buffer pinned = gpu_->allocate_host(n);
  gpu_->copy_to_host(gs(), pinned.data(), d.data(), n);
  gs().synchronize();
  std::memcpy(back.data(), pinned.data(), n);
  EXPECT_EQ(back, src);
}

TEST_F(GpuDevice, EventOrdersTwoStreams) {
  auto s2 = gpu_->create_stream();
  auto ev = gpu_->create_event();
  std::vector<float> xs(1 << 20, 1.5f);
  Pair x = make_f32({int64_t(xs.size())}, xs);
  Pair y = make_out(DType::F32, {int64_t(xs.size())});
  gops().scale(gs(), x.dev, 2.0f, x.dev);  // x = 3
  ev->record(gs());
  ev->wait(*s2);
  gops().scale(*s2, x.dev, 2.0f, y.dev);  // y = 6, only after the first scale
  s2->synchronize();
  for (float v : download_f32(y)) ASSERT_EQ(v, 6.0f);
}

TEST_F(GpuDevice, GraphCaptureOfDecodeOpsReplaysWithNewInputs) {
  std::mt19937 rng(3);
  const int64_t K = 512, N = 384, hd = 64, n_head = 4, n_kv = 2, bs = 16, n_blocks = 8;
  std::vector<float> wv;
  const auto wb = random_weights(DType::Q8_0, K, N, rng, wv);
  Pair W = make(DType::Q8_0, {K, N}, wb.data());
  Pair x = make_f32({K, 1}, random_floats(size_t(K), rng));
  Pair y = make_out(DType::F32, {N, 1});
  Pair norm_w = make_f32({K}, random_floats(size_t(K), rng));
  Pair xn = make_out(DType::F32, {K, 1});
  Pair kc = make(DType::BF16, {hd, n_kv, bs, n_blocks}, nullptr), vc = make(DType::BF16, {hd, n_kv, bs, n_blocks}, nullptr);
  {
    std::vector<uint16_t> init(static_cast<size_t>(hd * n_kv * bs * n_blocks));
    for (auto& h : init) h = fp32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    std::memcpy(kc.host.data(), init.data(), kc.host.size());
    upload(kc);
    for (auto& h : init) h = fp32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    std::memcpy(vc.host.data(), init.data(), vc.host.size());
    upload(vc);
  }
  Pair positions = make_i32({1}, {20});
  Pair seq_slot = make_i32({1}, {0});
  Pair tables = make_i32({4, 1}, {5, 2, 7, 0});
  Pair lens = make_i32({1}, {21});
  // q/k/v of the step come out of the matmul's y: q = y[0:256) as {64, 4}, k = y[256:320), v = y[320:384).
  Tensor q = Tensor::contiguous(DType::F32, {hd, n_head, 1}, y.dev_buf.data(), gpu_->id());
  Tensor k = Tensor::contiguous(DType::F32, {hd, n_kv, 1}, static_cast<float*>(y.dev_buf.data()) + 256, gpu_->id());
  Tensor v = Tensor::contiguous(DType::F32, {hd, n_kv, 1}, static_cast<float*>(y.dev_buf.data()) + 320, gpu_->id());
  Pair slot = make_i32({1}, {2 * 16 + 4});  // position 20 -> logical block 1 -> physical block 2, offset 4
  Pair attn = make_out(DType::F32, {hd, n_head, 1});
  KvLayerView kv{kc.dev, vc.dev, int(bs)};
  AttentionBatch batch;
  batch.positions = positions.dev;
  batch.seq_slot = seq_slot.dev;
  batch.block_tables = tables.dev;
  batch.seq_lens = lens.dev;
  batch.max_seq_len = 64;
  RopeParams rp;
  rp.n_rot = int(hd);
  rp.mode = RopeMode::Neox;
  rp.freq_base = 1e6f;

  auto step = [&](Stream& s) {
    gops().rms_norm(s, x.dev, &norm_w.dev, 1e-6f, xn.dev);
    gops().matmul(s, W.dev, xn.dev, y.dev);
    gops().rope(s, q, positions.dev, rp);
    gops().rope(s, k, positions.dev, rp);
    gops().kv_store(s, kv, k, v, slot.dev);
    gops().attention(s, q, kv, batch, 0.125f, attn.dev);
  };
  // Eager reference, then the same step captured once and replayed.
  auto eager = [&]() {
    step(gs());
    gs().synchronize();
    return download_f32(attn);
  };
  const std::vector<float> ref1 = eager();
  auto cap = gpu_->create_stream();
  cudaStream_t cs_raw = cuda::stream_of(*cap, 0);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(cs_raw, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  step(*cap);
  ASSERT_EQ(cudaStreamEndCapture(cs_raw, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  poison(attn);
  ASSERT_EQ(cudaGraphLaunch(exec, cs_raw), cudaSuccess);
  cap->synchronize();
  EXPECT_EQ(download_f32(attn), ref1);
  // New device inputs (position 21 at slot 2*16+5, one more cached position), same graph.
  positions.host.assign(4, 0);
  int32_t p21 = 21, l22 = 22, s21 = 2 * 16 + 5;
  std::memcpy(positions.host.data(), &p21, 4);
  upload(positions);
  std::memcpy(lens.host.data(), &l22, 4);
  upload(lens);
  std::memcpy(slot.host.data(), &s21, 4);
  upload(slot);
  const std::vector<float> ref2 = eager();
  EXPECT_NE(ref2, ref1);
  poison(attn);
  ASSERT_EQ(cudaGraphLaunch(exec, cs_raw), cudaSuccess);
  cap->synchronize();
  EXPECT_EQ(download_f32(attn), ref2);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace tandem::gpu_test
