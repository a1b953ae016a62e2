// Comms on GPUs: the copy comm with two ranks sharing cuda:0 (two Device objects of one GPU, the case of the
// one-GPU machine), the copy comm and NCCL across all GPUs when there are several, NCCL with one rank, and
// create_comm's choices. Every collective runs on the ranks' own streams and is checked against the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../test_comm_util.h"
#include "backend/backend.h"
#include "gpu_test_util.h"
#include "parallel/comm.h"

namespace tandem {
namespace {

using comm_test::expect_all_ok;
using comm_test::random_nonzero;
using comm_test::rank_order_sum;
using comm_test::run_ranks;

// One Device object per entry of `indices` (an index may repeat: ranks sharing a GPU).
struct GpuRanks {
  explicit GpuRanks(const std::vector<int>& indices) {
    for (int i : indices) {
      owned.push_back(create_device(DeviceId{DeviceKind::CUDA, i}));
      devices.push_back(owned.back().get());
    }
  }
  int n() const { return int(devices.size()); }
  Device& dev(int r) { return *devices[size_t(r)]; }
  std::vector<std::unique_ptr<Device>> owned;
  std::vector<Device*> devices;
};

std::vector<int> all_gpus() {
  std::vector<int> v;
  for (int i = 0; i < device_count(DeviceKind::CUDA); ++i) v.push_back(i);
  return v;
}

// A device buffer of `bytes` per rank.
std::vector<Buffer> alloc_per_rank(GpuRanks& g, size_t bytes) {
  std::vector<Buffer> b;
  for (int r = 0; r < g.n(); ++r) b.push_back(g.dev(r).allocate(bytes));
  return b;
}

void upload(Device& d, Buffer& b, const void* src, size_t bytes) {
  d.copy_from_host(d.default_stream(), b.data(), src, bytes);
  d.default_stream().synchronize();
}

template <class T>
std::vector<T> download(Device& d, const Buffer& b, size_t count) {
  std::vector<T> v(count);
  d.copy_to_host(d.default_stream(), v.data(), b.data(), count * sizeof(T));
  d.default_stream().synchronize();
  return v;
}

// Runs every collective of `comm` over the ranks of `g` and checks the results. exact: the all-reduce must
// equal the rank-order float sum bit for bit on every rank (cpu and copy); otherwise (NCCL, whose summation
// order is its own) within the rounding of any order.
void check_collectives(Comm& comm, GpuRanks& g, bool exact) {
  const int R = g.n();
  ASSERT_EQ(comm.n_ranks(), R);
  std::mt19937 rng(42 + R);
  const size_t max_elems = 65537;
  comm.reserve(max_elems * sizeof(float));

  for (size_t n : {size_t(1), size_t(3), size_t(4099), max_elems}) {
    std::vector<std::vector<float>> in;
    for (int r = 0; r < R; ++r) in.push_back(random_nonzero(n, rng, r % 2 ? 1e-3f : 1.0f));
    std::vector<Buffer> x = alloc_per_rank(g, n * sizeof(float));
    for (int r = 0; r < R; ++r) upload(g.dev(r), x[size_t(r)], in[size_t(r)].data(), n * sizeof(float));
    expect_all_ok(run_ranks(comm, [&](int r) {
      Stream& s = g.dev(r).default_stream();
      comm.all_reduce_sum(r, s,
                          Tensor::contiguous(DType::F32, {int64_t(n)}, x[size_t(r)].data(), g.dev(r).id()));
      s.synchronize();
    }));
    const std::vector<float> expected = rank_order_sum(in);
    for (int r = 0; r < R; ++r) {
      const std::vector<float> got = download<float>(g.dev(r), x[size_t(r)], n);
      if (exact) {
        EXPECT_EQ(std::memcmp(got.data(), expected.data(), n * sizeof(float)), 0)
            << comm.kind() << ": rank " << r << ", " << n << " elements";
      } else {
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          double mag = 0;
          for (int q = 0; q < R; ++q) mag += std::fabs(in[size_t(q)][i]);
          if (!(std::fabs(double(got[i]) - expected[i]) <= 4e-7 * R * mag)) ++bad;
        }
        EXPECT_EQ(bad, 0u) << comm.kind() << ": rank " << r << ", " << n << " elements";
      }
    }
  }

  // all_gather of I32 (bytes are moved as they are)
  for (int64_t count : {1, 1000}) {
    std::vector<std::vector<int32_t>> send(static_cast<size_t>(R));
    std::vector<int32_t> expected;
    std::vector<Buffer> sb = alloc_per_rank(g, size_t(count) * 4),
                        rb = alloc_per_rank(g, size_t(count * R) * 4);
    for (int r = 0; r < R; ++r) {
      for (int64_t i = 0; i < count; ++i) send[size_t(r)].push_back(int32_t(rng()));
      expected.insert(expected.end(), send[size_t(r)].begin(), send[size_t(r)].end());
      upload(g.dev(r), sb[size_t(r)], send[size_t(r)].data(), size_t(count) * 4);
    }
    expect_all_ok(run_ranks(comm, [&](int r) {
      Stream& s = g.dev(r).default_stream();
      comm.all_gather(r, s, Tensor::contiguous(DType::I32, {count}, sb[size_t(r)].data(), g.dev(r).id()),
                      Tensor::contiguous(DType::I32, {count, R}, rb[size_t(r)].data(), g.dev(r).id()));
      s.synchronize();
    }));
    for (int r = 0; r < R; ++r)
      EXPECT_EQ(download<int32_t>(g.dev(r), rb[size_t(r)], size_t(count * R)), expected)
          << comm.kind() << ": all_gather x" << count << " rank " << r;
  }

  // broadcast from every root
  for (int root = 0; root < R; ++root) {
    const int64_t count = 777;
    std::vector<std::vector<float>> x;
    std::vector<Buffer> b = alloc_per_rank(g, size_t(count) * 4);
    for (int r = 0; r < R; ++r) {
      x.push_back(random_nonzero(size_t(count), rng, 1.0f));
      upload(g.dev(r), b[size_t(r)], x.back().data(), size_t(count) * 4);
    }
    expect_all_ok(run_ranks(comm, [&](int r) {
      Stream& s = g.dev(r).default_stream();
      comm.broadcast(r, s, Tensor::contiguous(DType::F32, {count}, b[size_t(r)].data(), g.dev(r).id()), root);
      comm.barrier(r, s);
      s.synchronize();
    }));
    for (int r = 0; r < R; ++r)
      EXPECT_EQ(download<float>(g.dev(r), b[size_t(r)], size_t(count)), x[size_t(root)])
          << comm.kind() << ": broadcast root " << root << " rank " << r;
  }

  // Back to back with no host synchronisation: each iteration fills x on the rank's stream, all-reduces it
  // and copies the result into row `it` of a log; the log is checked once at the end. Stream ordering (and
  // the comm's events) must keep every iteration's data apart.
  const int iters = 100;
  const int64_t n = 1000;
  std::vector<Buffer> x = alloc_per_rank(g, size_t(n) * 4), log = alloc_per_rank(g, size_t(n * iters) * 4);
  expect_all_ok(run_ranks(comm, [&](int r) {
    Device& d = g.dev(r);
    Stream& s = d.default_stream();
    const Tensor xt = Tensor::contiguous(DType::F32, {n}, x[size_t(r)].data(), d.id());
    const Tensor lt = Tensor::contiguous(DType::F32, {n, iters}, log[size_t(r)].data(), d.id());
    for (int it = 0; it < iters; ++it) {
      d.ops().fill(s, xt, float(r + 1 + it % 7));
      comm.all_reduce_sum(r, s, xt);
      d.ops().copy(s, xt, lt.rows(it, 1));
    }
    s.synchronize();
  }));
  for (int r = 0; r < R; ++r) {
    const std::vector<float> got = download<float>(g.dev(r), log[size_t(r)], size_t(n * iters));
    size_t bad = 0;
    for (int it = 0; it < iters; ++it) {
      float want = 0;
      for (int q = 0; q < R; ++q) want += float(q + 1 + it % 7);
      for (int64_t i = 0; i < n; ++i) bad += got[size_t(it * n + i)] != want;
    }
    EXPECT_EQ(bad, 0u) << comm.kind() << ": back-to-back all-reduce, rank " << r;
  }
}

TEST(CommGpu, CopyCommTwoRanksSharingOneGpu) {
  TANDEM_REQUIRE_GPU();
  GpuRanks g({0, 0});
  auto comm = create_copy_comm(g.devices);
  check_collectives(*comm, g, /*exact=*/true);
}

TEST(CommGpu, CopyCommAcrossAllGpus) {
  TANDEM_REQUIRE_GPU();
  if (device_count(DeviceKind::CUDA) < 2) GTEST_SKIP() << "needs 2 GPUs";
  GpuRanks g(all_gpus());
  auto comm = create_copy_comm(g.devices);
  check_collectives(*comm, g, /*exact=*/true);
}

TEST(CommGpu, AutoPicksCopyForRanksSharingAGpu) {
  TANDEM_REQUIRE_GPU();
  GpuRanks g({0, 0});
  EXPECT_STREQ(create_comm(g.devices)->kind(), "copy");
  EXPECT_STREQ(create_comm(g.devices, CommKind::Copy)->kind(), "copy");
  EXPECT_THROW(create_comm(g.devices, CommKind::Nccl), Error);  // a GPU twice, or no NCCL in this build
  EXPECT_THROW(create_comm(g.devices, CommKind::Cpu), Error);
  std::unique_ptr<Device> cpu = create_device(DeviceId{DeviceKind::CPU, 0});
  std::vector<Device*> mixed = {cpu.get(), g.devices[0]};
  EXPECT_THROW(create_comm(mixed), Error);
}

#if defined(TANDEM_HAVE_NCCL)
TEST(CommGpu, NcclOneRank) {
  TANDEM_REQUIRE_GPU();
  GpuRanks g({0});
  auto comm = create_comm(g.devices, CommKind::Nccl);
  EXPECT_STREQ(comm->kind(), "nccl");
  check_collectives(*comm, g, /*exact=*/true);
}

// The comm a process of an MPI job creates for its one rank (ncclCommInitRank from a unique id that rank 0
// broadcasts), here as the only process: the collectives, and a call for a rank this process does not hold.
TEST(CommGpu, NcclRankCommOfASingleProcess) {
  TANDEM_REQUIRE_GPU();
  GpuRanks g({0});
  auto comm = create_nccl_rank_comm(g.dev(0), 0, 1, nccl_unique_id());
  EXPECT_STREQ(comm->kind(), "nccl");
  EXPECT_EQ(comm->n_ranks(), 1);
  check_collectives(*comm, g, /*exact=*/true);
  EXPECT_THROW(comm->barrier(1, g.dev(0).default_stream()), Error);
  EXPECT_THROW(create_nccl_rank_comm(g.dev(0), 1, 1, nccl_unique_id()), Error);
}

TEST(CommGpu, NcclAcrossAllGpus) {
  TANDEM_REQUIRE_GPU();
  if (device_count(DeviceKind::CUDA) < 2) GTEST_SKIP() << "needs 2 GPUs";
  GpuRanks g(all_gpus());
  auto comm = create_comm(g.devices);
  EXPECT_STREQ(comm->kind(), "nccl");
  // Two ranks: a + b is the same in any order, so NCCL must match exactly too.
  check_collectives(*comm, g, /*exact=*/g.n() == 2);
}
#endif

}  // namespace
}  // namespace tandem
