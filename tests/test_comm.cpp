// The cpu and copy comms on CPU "devices" (cpu:0 .. cpu:N-1, one host thread per rank): every collective
// against a host reference (the all-reduce bit-exactly against the rank-order float sum), back-to-back calls,
// abort, bad arguments (which must make every rank throw, never hang), and create_comm's choices.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "parallel/comm.h"
#include "test_comm_util.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using comm_test::expect_all_ok;
using comm_test::expect_all_throw;
using comm_test::random_nonzero;
using comm_test::run_ranks;

// N CPU devices, one thread each (the rank's host thread is the only worker).
struct CpuRanks {
  explicit CpuRanks(int n) {
    for (int i = 0; i < n; ++i) {
      owned.push_back(create_device(DeviceId{DeviceKind::CPU, i}, {.n_threads = 1}));
      devices.push_back(owned.back().get());
    }
  }
  std::vector<std::unique_ptr<Device>> owned;
  std::vector<Device*> devices;
};

std::unique_ptr<Comm> make_comm(const std::string& kind, CpuRanks& ranks) {
  if (kind == "cpu") return create_cpu_comm(ranks.devices);
  return create_copy_comm(ranks.devices);
}

Tensor f32_view(std::vector<float>& v, Device& d) {
  return Tensor::contiguous(DType::F32, {int64_t(v.size())}, v.data(), d.id());
}

class CommTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    ranks_ = std::make_unique<CpuRanks>(n());
    comm_ = make_comm(kind(), *ranks_);
    ASSERT_EQ(comm_->n_ranks(), n());
    ASSERT_STREQ(comm_->kind(), kind().c_str());
  }
  const std::string& kind() const { return std::get<0>(GetParam()); }
  int n() const { return std::get<1>(GetParam()); }
  Device& dev(int r) { return *ranks_->devices[size_t(r)]; }
  Stream& stream(int r) { return dev(r).default_stream(); }

  std::unique_ptr<CpuRanks> ranks_;
  std::unique_ptr<Comm> comm_;
};

TEST_P(CommTest, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  const int R = n();
  std::mt19937 rng(1234 + R);
  const std::vector<size_t> sizes = {1, 2, 3, 5, 7, 64, 1001, 4099, 65537};
  comm_->reserve(65537 * sizeof(float));
  size_t order_sensitive = 0;  // elements where another summation order would round differently
  for (size_t n_elems : sizes) {
    std::vector<std::vector<float>> data;
    for (int r = 0; r < R; ++r) data.push_back(random_nonzero(n_elems, rng, r % 2 ? 1e-3f : 1.0f));
    const std::vector<std::vector<float>> expected_inputs = data;
    std::vector<float> expected(n_elems);
    for (size_t i = 0; i < n_elems; ++i) {
      float s = expected_inputs[0][i];
      for (int r = 1; r < R; ++r) s += expected_inputs[size_t(r)][i];
      expected[i] = s;
      float rev = expected_inputs[size_t(R - 1)][i];
      for (int r = R - 2; r >= 0; --r) rev += expected_inputs[size_t(r)][i];
      if (rev != s) ++order_sensitive;
    }
    // A 2-D view for one size: the shape does not matter, only the element count.
    const bool two_d = n_elems == 1001;
    expect_all_ok(run_ranks(*comm_, [&](int r) {
      Tensor x = f32_view(data[size_t(r)], dev(r));
      if (two_d) x = Tensor::contiguous(DType::F32, {77, 13}, data[size_t(r)].data(), dev(r).id());
      comm_->all_reduce_sum(r, stream(r), x);
    }));
    for (int r = 0; r < R; ++r)
      EXPECT_EQ(std::memcmp(data[size_t(r)].data(), expected.data(), n_elems * sizeof(float)), 0)
          << "rank " << r << " of " << R << ", " << n_elems << " elements";
  }
  if (R >= 3) {
    EXPECT_GT(order_sensitive, 0u) << "the data should make the summation order visible";
  }
}

TEST_P(CommTest, AllGatherConcatenatesInRankOrder) {
  const int R = n();
  std::mt19937 rng(99);
  comm_->reserve(1000 * sizeof(float));
  for (DType type : {DType::F32, DType::F16, DType::I32}) {
    for (int64_t count : {1, 5, 1000}) {
      const size_t bytes = dtype_row_bytes(type, count);
      std::vector<std::vector<uint8_t>> send(static_cast<size_t>(R)), recv(static_cast<size_t>(R));
      std::vector<uint8_t> expected;
      for (int r = 0; r < R; ++r) {
        send[size_t(r)].resize(bytes);
        for (auto& b : send[size_t(r)]) b = uint8_t(rng());
        recv[size_t(r)].assign(bytes * size_t(R), 0xEE);
        expected.insert(expected.end(), send[size_t(r)].begin(), send[size_t(r)].end());
      }
      expect_all_ok(run_ranks(*comm_, [&](int r) {
        Tensor s = Tensor::contiguous(type, {count}, send[size_t(r)].data(), dev(r).id());
        Tensor v = Tensor::contiguous(type, {count, R}, recv[size_t(r)].data(), dev(r).id());
        comm_->all_gather(r, stream(r), s, v);
      }));
      for (int r = 0; r < R; ++r)
        EXPECT_EQ(recv[size_t(r)], expected) << dtype_name(type) << " x" << count << " rank " << r;
    }
  }
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  const int R = n();
  std::mt19937 rng(7);
  comm_->reserve(999 * sizeof(int32_t));
  for (int root = 0; root < R; ++root) {
    for (int64_t count : {1, 999}) {
      std::vector<std::vector<int32_t>> x(static_cast<size_t>(R));
      for (auto& v : x) {
        v.resize(size_t(count));
        for (auto& e : v) e = int32_t(rng());
      }
      const std::vector<int32_t> expected = x[size_t(root)];
      expect_all_ok(run_ranks(*comm_, [&](int r) {
        comm_->broadcast(r, stream(r),
                         Tensor::contiguous(DType::I32, {count}, x[size_t(r)].data(), dev(r).id()), root);
      }));
      for (int r = 0; r < R; ++r) EXPECT_EQ(x[size_t(r)], expected) << "root " << root << " rank " << r;
    }
  }
}

TEST_P(CommTest, BarrierWaitsForEveryRank) {
  const int R = n();
  std::atomic<int> arrived{0};
  std::vector<int> early(size_t(R), 0);
  expect_all_ok(run_ranks(*comm_, [&](int r) {
    for (int it = 0; it < 50; ++it) {
      if ((it + r) % 3 == 0) std::this_thread::yield();
      arrived.fetch_add(1);
      comm_->barrier(r, stream(r));
      if (arrived.load() < R * (it + 1)) ++early[size_t(r)];
    }
  }));
  for (int r = 0; r < R; ++r) EXPECT_EQ(early[size_t(r)], 0) << "rank " << r << " left a barrier early";
}

// Many small collectives in a row, with results checked every time: a race between one call and the next
// (scratch or posts reused too early) shows as a wrong value.
TEST_P(CommTest, BackToBackCollectivesStayCorrect) {
  const int R = n();
  comm_->reserve(16 * sizeof(float));
  std::vector<int> wrong(size_t(R), 0);
  expect_all_ok(run_ranks(*comm_, [&](int r) {
    std::vector<float> x(16), recv(16 * size_t(R));
    std::vector<float> send(3);
    for (int it = 0; it < 200; ++it) {
      const int64_t count = 1 + it % 9;
      // Element i of rank q is (it + 1) * (q + 1) + i: small integers, so the sum is exact in any order.
      for (int64_t i = 0; i < count; ++i) x[size_t(i)] = float((it + 1) * (r + 1) + i);
      comm_->all_reduce_sum(r, stream(r), Tensor::contiguous(DType::F32, {count}, x.data(), dev(r).id()));
      for (int64_t i = 0; i < count; ++i)
        if (x[size_t(i)] != float((it + 1) * R * (R + 1) / 2 + R * i)) ++wrong[size_t(r)];

      for (int k = 0; k < 3; ++k) send[size_t(k)] = float(1000 * it + 10 * r + k);
      comm_->all_gather(r, stream(r), Tensor::contiguous(DType::F32, {3}, send.data(), dev(r).id()),
                        Tensor::contiguous(DType::F32, {3 * R}, recv.data(), dev(r).id()));
      for (int q = 0; q < R; ++q)
        for (int k = 0; k < 3; ++k)
          if (recv[size_t(3 * q + k)] != float(1000 * it + 10 * q + k)) ++wrong[size_t(r)];

      const int root = it % R;
      x[0] = float(it * 100 + r);
      comm_->broadcast(r, stream(r), Tensor::contiguous(DType::F32, {1}, x.data(), dev(r).id()), root);
      if (x[0] != float(it * 100 + root)) ++wrong[size_t(r)];
      if (it % 50 == 0) comm_->barrier(r, stream(r));
    }
  }));
  for (int r = 0; r < R; ++r) EXPECT_EQ(wrong[size_t(r)], 0) << "rank " << r;
}

TEST_P(CommTest, AbortWakesWaitingRanks) {
  const int R = n();
  comm_->reserve(64);
  std::vector<float> x(size_t(R) * 4, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(
      *comm_,
      [&](int r) {
        if (r == 0) {  // rank 0 "fails" instead of joining the all-reduce
          std::this_thread::sleep_for(50ms);
          comm_->abort();
          return;
        }
        comm_->all_reduce_sum(r, stream(r),
                              Tensor::contiguous(DType::F32, {4}, &x[size_t(r) * 4], dev(r).id()));
      },
      5s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(errors[0], "");
  for (int r = 1; r < R; ++r)
    EXPECT_NE(errors[size_t(r)].find("aborted"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
  // Irreversible: later collectives throw at once.
  expect_all_throw(run_ranks(
                       *comm_, [&](int r) { comm_->barrier(r, stream(r)); }, 5s),
                   "aborted");
}

TEST_P(CommTest, BadArgumentsThrowOnEveryRankAndTheCommRecovers) {
  const int R = n();
  comm_->reserve(4 * sizeof(float));
  std::vector<std::vector<float>> x(size_t(R), std::vector<float>(8, 1.0f));
  auto reduce = [&](int r, int64_t count) {
    comm_->all_reduce_sum(r, stream(r),
                          Tensor::contiguous(DType::F32, {count}, x[size_t(r)].data(), dev(r).id()));
  };
  // More than reserved.
  expect_all_throw(run_ranks(*comm_, [&](int r) { reduce(r, 8); }), "reserve");
  // Shapes that differ between ranks.
  expect_all_throw(run_ranks(*comm_, [&](int r) { reduce(r, r == R - 1 ? 3 : 4); }), "same shape");
  // One rank passes a tensor of another device.
  expect_all_throw(run_ranks(*comm_,
                             [&](int r) {
                               const DeviceId id = r == 1 ? dev(0).id() : dev(r).id();
                               comm_->all_reduce_sum(
                                   r, stream(r),
                                   Tensor::contiguous(DType::F32, {4}, x[size_t(r)].data(), id));
                             }),
                   "lives on cpu:0");
  // One rank passes an I32 tensor.
  expect_all_throw(run_ranks(*comm_,
                             [&](int r) {
                               const DType t = r == 0 ? DType::I32 : DType::F32;
                               comm_->all_reduce_sum(
                                   r, stream(r),
                                   Tensor::contiguous(t, {4}, x[size_t(r)].data(), dev(r).id()));
                             }),
                   "F32");
  // Collectives called in different orders.
  expect_all_throw(run_ranks(*comm_,
                             [&](int r) {
                               if (r == 0)
                                 comm_->barrier(r, stream(r));
                               else
                                 reduce(r, 4);
                             }),
                   "out of order");
  // A broadcast root out of range.
  expect_all_throw(run_ranks(*comm_,
                             [&](int r) {
                               comm_->broadcast(
                                   r, stream(r),
                                   Tensor::contiguous(DType::F32, {4}, x[size_t(r)].data(), dev(r).id()), R);
                             }),
                   "root");
  // An all_gather receive buffer of the wrong size.
  std::vector<float> recv(8 * size_t(R));
  expect_all_throw(run_ranks(*comm_,
                             [&](int r) {
                               comm_->all_gather(
                                   r, stream(r),
                                   Tensor::contiguous(DType::F32, {2}, x[size_t(r)].data(), dev(r).id()),
                                   Tensor::contiguous(DType::F32, {2 * R + 1}, recv.data(), dev(r).id()));
                             }),
                   "recv");
  // Every rank threw at the same point, so the comm is still in step: the next collective works.
  comm_->reserve(8 * sizeof(float));
  expect_all_ok(run_ranks(*comm_, [&](int r) { reduce(r, 8); }));
  for (int r = 0; r < R; ++r) EXPECT_EQ(x[size_t(r)], std::vector<float>(8, float(R))) << "rank " << r;
}

TEST_P(CommTest, BadRankIndexAbortsTheComm) {
  std::vector<float> x(4, 1.0f);
  Tensor t = Tensor::contiguous(DType::F32, {4}, x.data(), dev(0).id());
  comm_->reserve(16);
  EXPECT_THROW(comm_->all_reduce_sum(n(), stream(0), t), Error);
  EXPECT_THROW(comm_->barrier(-1, stream(0)), Error);
  expect_all_throw(run_ranks(
                       *comm_, [&](int r) { comm_->barrier(r, stream(r)); }, 5s),
                   "aborted");
}

std::string param_name(const ::testing::TestParamInfo<CommTest::ParamType>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(Comm, CommTest,
                         ::testing::Combine(::testing::Values(std::string("cpu"), std::string("copy")),
                                            ::testing::Values(2, 3, 4)),
                         param_name);

TEST(CommSingleRank, CollectivesAreIdentities) {
  for (const std::string kind : {"cpu", "copy"}) {
    CpuRanks ranks(1);
    auto comm = make_comm(kind, ranks);
    Device& d = *ranks.devices[0];
    comm->reserve(64);
    std::vector<float> x = {1.5f, -2.25f, 3.0f}, y = x, recv(3, 0.0f);
    comm->all_reduce_sum(0, d.default_stream(), f32_view(x, d));
    EXPECT_EQ(x, y) << kind;
    comm->all_gather(0, d.default_stream(), f32_view(x, d), f32_view(recv, d));
    EXPECT_EQ(recv, y) << kind;
    comm->broadcast(0, d.default_stream(), f32_view(x, d), 0);
    EXPECT_EQ(x, y) << kind;
    comm->barrier(0, d.default_stream());
  }
}

TEST(CommCreate, PicksTheImplementationForCpuDevices) {
  CpuRanks ranks(3);
  EXPECT_STREQ(create_comm(ranks.devices)->kind(), "cpu");
  EXPECT_STREQ(create_comm(ranks.devices, CommKind::Cpu)->kind(), "cpu");
  EXPECT_STREQ(create_comm(ranks.devices, CommKind::Copy)->kind(), "copy");
  EXPECT_EQ(create_comm(ranks.devices)->n_ranks(), 3);
}

TEST(CommCreate, RejectsWhatItCannotServe) {
  CpuRanks ranks(2);
  // NCCL never serves CPU devices (and this build may not have NCCL at all).
  EXPECT_THROW(create_comm(ranks.devices, CommKind::Nccl), Error);
  try {
    create_comm(ranks.devices, CommKind::Nccl);
  } catch (const Error& e) {
    const std::string m = e.what();
#if defined(TANDEM_HAVE_NCCL)
    EXPECT_NE(m.find("CUDA devices only"), std::string::npos) << m;
#else
    EXPECT_NE(m.find("without NCCL"), std::string::npos) << m;
#endif
  }
  std::vector<Device*> none;
  EXPECT_THROW(create_comm(none), Error);
  std::vector<Device*> twice = {ranks.devices[0], ranks.devices[0]};
  EXPECT_THROW(create_comm(twice), Error);
  EXPECT_THROW(create_copy_comm(twice), Error);
  std::vector<Device*> with_null = {ranks.devices[0], nullptr};
  EXPECT_THROW(create_comm(with_null), Error);
  EXPECT_THROW(create_cpu_comm(with_null), Error);
}

}  // namespace
}  // namespace tandem
