// The mesh flags (src/parallel/mesh.h): parse_split_mode, parse_device_list, parse_tensor_split,
// check_devices_exist, make_mesh_spec and MeshSpec::describe, on good values and on every kind of bad input.
// Every error must be a tandem::Error whose message names the flag and quotes the offending value.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "parallel/mesh.h"

namespace tandem {
namespace {

const DeviceId kCpu0{DeviceKind::CPU, 0};
const DeviceId kCpu1{DeviceKind::CPU, 1};
const DeviceId kCpu2{DeviceKind::CPU, 2};
const DeviceId kCuda0{DeviceKind::CUDA, 0};
const DeviceId kCuda1{DeviceKind::CUDA, 1};

// Runs fn, expects a tandem::Error, and returns its message ("" and a failure when nothing was thrown).
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a tandem::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// The message contains every one of the pieces.
void expect_mentions(const std::string& msg, std::initializer_list<const char*> pieces) {
  for (const char* p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// ---- split modes
// ----------------------------------------------------------------------------------------------

TEST(MeshSplitMode, ParsesEveryModeAndNamesRoundTrip) {
  for (SplitMode m : {SplitMode::None, SplitMode::Layer, SplitMode::Row, SplitMode::Tensor})
    EXPECT_EQ(parse_split_mode(split_mode_name(m)), m);
  EXPECT_STREQ(split_mode_name(SplitMode::Tensor), "tensor");
  EXPECT_STREQ(split_mode_name(SplitMode::None), "none");
}

TEST(MeshSplitMode, UnknownModeNamesFlagValueAndChoices) {
  for (const char* bad : {"diagonal", "", "Tensor", "rows"}) {
    const std::string msg = error_of([&] { parse_split_mode(bad); });
    expect_mentions(msg, {"--split-mode", "none, layer, row or tensor"});
    const std::string quoted = std::string("'").append(bad).append("'");  // not "'" + s: GCC 12 -Wrestrict
    EXPECT_NE(msg.find(quoted), std::string::npos) << msg;
  }
}

// ---- device lists
// ---------------------------------------------------------------------------------------------

TEST(MeshDeviceList, ParsesCpuAndCudaLists) {
  EXPECT_EQ(parse_device_list("cpu:0,cpu:1,cpu:2"), (std::vector<DeviceId>{kCpu0, kCpu1, kCpu2}));
  EXPECT_EQ(parse_device_list("cuda:0,cuda:1"), (std::vector<DeviceId>{kCuda0, kCuda1}));
  EXPECT_EQ(parse_device_list("cuda:1,cuda:0"), (std::vector<DeviceId>{kCuda1, kCuda0}));  // rank order kept
  EXPECT_EQ(parse_device_list("cpu"), (std::vector<DeviceId>{kCpu0}));  // bare kind = index 0
  EXPECT_EQ(parse_device_list("cuda"), (std::vector<DeviceId>{kCuda0}));
  EXPECT_EQ(parse_device_list(" cpu:0 , cpu:1 "), (std::vector<DeviceId>{kCpu0, kCpu1}));  // spaces ignored
  EXPECT_EQ(parse_device_list("cpu:12"), (std::vector<DeviceId>{DeviceId{DeviceKind::CPU, 12}}));
}

TEST(MeshDeviceList, EmptyEntryOrEmptyList) {
  expect_mentions(error_of([] { parse_device_list("cpu:0,,cpu:1"); }),
                  {"--devices", "'cpu:0,,cpu:1'", "empty"});
  expect_mentions(error_of([] { parse_device_list("cpu:0,"); }), {"--devices", "empty"});
  expect_mentions(error_of([] { parse_device_list(",cpu:0"); }), {"--devices", "empty"});
  expect_mentions(error_of([] { parse_device_list(""); }), {"--devices", "empty", "cuda:0,cuda:1"});
}

TEST(MeshDeviceList, UnknownKind) {
  for (const char* bad : {"gpu:0", "tpu", "cpu:0,tpu:1", "CUDA:0", "cudax:0"})
    expect_mentions(error_of([&] { parse_device_list(bad); }),
                    {"--devices", "unknown device", "cpu:N", "cuda:N"});
  expect_mentions(error_of([] { parse_device_list("cpu:0,tpu:1"); }), {"'tpu:1'"});
}

TEST(MeshDeviceList, BadIndex) {
  for (const char* bad : {"cuda:x", "cpu:-1", "cpu:", "cuda:1.5", "cuda:0:1", "cpu:+1", "cuda:99999999999"}) {
    const std::string msg = error_of([&] { parse_device_list(bad); });
    expect_mentions(msg, {"--devices", "bad device index", "non-negative integer"});
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;  // the entry is quoted
  }
}

TEST(MeshDeviceList, DuplicateDevice) {
  expect_mentions(error_of([] { parse_device_list("cpu:0,cpu:1,cpu:0"); }), {"--devices", "cpu:0", "twice"});
  // A GPU may repeat: two ranks share it ("cuda" and "cuda:0" are the same device).
  const std::vector<DeviceId> shared = parse_device_list("cuda,cuda:0");
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_TRUE(shared[0] == shared[1]);
}

// ---- ratios
// ---------------------------------------------------------------------------------------------------

TEST(MeshTensorSplit, NormalisesToSumOne) {
  const std::vector<double> r = parse_tensor_split("3,1", 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_DOUBLE_EQ(r[0], 0.75);
  EXPECT_DOUBLE_EQ(r[1], 0.25);
  const std::vector<double> h = parse_tensor_split("0.5, 0.5", 2);
  EXPECT_DOUBLE_EQ(h[0], 0.5);
  EXPECT_DOUBLE_EQ(h[1], 0.5);
  const std::vector<double> z = parse_tensor_split("1,0,1", 3);  // a zero ratio (not all) is allowed
  EXPECT_DOUBLE_EQ(z[0], 0.5);
  EXPECT_DOUBLE_EQ(z[1], 0.0);
  EXPECT_DOUBLE_EQ(z[2], 0.5);
  const std::vector<double> one = parse_tensor_split("7", 1);
  EXPECT_EQ(one, std::vector<double>{1.0});
}

TEST(MeshTensorSplit, EmptyGivesEqualRatios) {
  const std::vector<double> r = parse_tensor_split("", 4);
  ASSERT_EQ(r.size(), 4u);
  for (double x : r) EXPECT_DOUBLE_EQ(x, 0.25);
  const std::vector<double> third = parse_tensor_split("", 3);
  double sum = 0;
  for (double x : third) sum += x;
  EXPECT_NEAR(sum, 1.0, 1e-15);
}

TEST(MeshTensorSplit, NotANumber) {
  for (const char* bad : {"3,a", "1,x", "1,,1", "1;1", "1 2"}) {
    const std::string msg = error_of([&] { parse_tensor_split(bad, 2); });
    expect_mentions(msg, {"--tensor-split", "not a number"});
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  }
}

TEST(MeshTensorSplit, NegativeNanInfinite) {
  expect_mentions(error_of([] { parse_tensor_split("-1,2", 2); }), {"--tensor-split", "'-1'", "negative"});
  expect_mentions(error_of([] { parse_tensor_split("nan,1", 2); }), {"--tensor-split", "'nan'", "finite"});
  expect_mentions(error_of([] { parse_tensor_split("1,inf", 2); }), {"--tensor-split", "'inf'", "finite"});
}

TEST(MeshTensorSplit, AllZero) {
  expect_mentions(error_of([] { parse_tensor_split("0,0", 2); }), {"--tensor-split", "'0,0'", "positive"});
}

TEST(MeshTensorSplit, WrongCount) {
  expect_mentions(error_of([] { parse_tensor_split("1,1,1", 2); }),
                  {"--tensor-split", "'1,1,1'", "3 ratios for 2 devices", "one ratio per device"});
  expect_mentions(error_of([] { parse_tensor_split("1", 3); }), {"--tensor-split", "1 ratio for 3 devices"});
}

// ---- existence
// ------------------------------------------------------------------------------------------------

TEST(MeshDevicesExist, CpuDevicesAlwaysExist) {
  EXPECT_NO_THROW(check_devices_exist({kCpu0, kCpu1, DeviceId{DeviceKind::CPU, 7}}));
}

TEST(MeshDevicesExist, MissingCudaDeviceSaysWhy) {
  const int n = device_count(DeviceKind::CUDA);
  const DeviceId missing{DeviceKind::CUDA, n};  // one past the last GPU (cuda:0 on a machine without GPUs)
  const std::string msg = error_of([&] { check_devices_exist({missing}); });
  expect_mentions(msg, {"does not exist"});
  EXPECT_NE(msg.find(missing.to_string()), std::string::npos) << msg;
#if !defined(TANDEM_HAVE_CUDA)
  expect_mentions(msg, {"no CUDA support"});
#else
  expect_mentions(msg, {"this machine has"});
#endif
}

// ---- make_mesh_spec
// -------------------------------------------------------------------------------------------

TEST(MeshSpecBuild, DefaultsToNoneOnTheDefaultDevice) {
  const MeshSpec m = make_mesh_spec("", "", "", 0, false, kCpu0);
  EXPECT_EQ(m.mode, SplitMode::None);
  EXPECT_EQ(m.devices, std::vector<DeviceId>{kCpu0});
  EXPECT_EQ(m.n_ranks(), 1u);
  EXPECT_EQ(m.main_device, 0);
  EXPECT_EQ(m.ratios, std::vector<double>{1.0});
  EXPECT_FALSE(m.ratios_given);
  EXPECT_EQ(m.describe(), "none on cpu:0");
  // "none" spelled out is the same; the default device may be another CPU device.
  EXPECT_EQ(make_mesh_spec("", "none", "", 0, false, kCpu2).describe(), "none on cpu:2");
}

TEST(MeshSpecBuild, TensorOverCpuRanks) {
  const MeshSpec m = make_mesh_spec("cpu:0,cpu:1", "tensor", "", 0, false, kCpu0);
  EXPECT_EQ(m.mode, SplitMode::Tensor);
  EXPECT_EQ(m.devices, (std::vector<DeviceId>{kCpu0, kCpu1}));
  EXPECT_EQ(m.ratios, (std::vector<double>{0.5, 0.5}));
  EXPECT_FALSE(m.ratios_given);
  EXPECT_EQ(m.describe(), "tensor over cpu:0,cpu:1 (ratios 0.5,0.5)");
}

TEST(MeshSpecBuild, RatiosMainDeviceAndReplicatedKv) {
  const MeshSpec m = make_mesh_spec("cpu:0,cpu:1,cpu:2", "row", "2,1,1", 1, false, kCpu0);
  EXPECT_EQ(m.mode, SplitMode::Row);
  EXPECT_EQ(m.n_ranks(), 3u);
  EXPECT_EQ(m.main_device, 1);
  EXPECT_TRUE(m.ratios_given);
  ASSERT_EQ(m.ratios.size(), 3u);
  EXPECT_DOUBLE_EQ(m.ratios[0], 0.5);
  EXPECT_DOUBLE_EQ(m.ratios[1], 0.25);
  EXPECT_EQ(m.describe(), "row over cpu:0,cpu:1,cpu:2 (ratios 0.5,0.25,0.25), main cpu:1");

  const MeshSpec t = make_mesh_spec("cpu:0,cpu:1,cpu:2,cpu:3", "tensor", "", 0, true, kCpu0);
  EXPECT_TRUE(t.replicate_kv);
  EXPECT_EQ(t.describe(),
            "tensor over cpu:0,cpu:1,cpu:2,cpu:3 (ratios 0.25,0.25,0.25,0.25), replicated KV heads");

  const MeshSpec l = make_mesh_spec("cpu:1,cpu:0", "layer", "3,1", 0, false, kCpu0);
  EXPECT_EQ(l.devices, (std::vector<DeviceId>{kCpu1, kCpu0}));
  EXPECT_EQ(l.describe(), "layer over cpu:1,cpu:0 (ratios 0.75,0.25)");
}

TEST(MeshSpecBuild, NoneWithSeveralDevicesUsesTheMainOne) {
  const MeshSpec m = make_mesh_spec("cpu:0,cpu:1,cpu:2", "none", "", 2, false, kCpu0);
  EXPECT_EQ(m.devices, std::vector<DeviceId>{kCpu2});
  EXPECT_EQ(m.main_device, 0);
  EXPECT_EQ(m.describe(), "none on cpu:2");
}

TEST(MeshSpecBuild, SplitModeWithOneDeviceIsOneRank) {
  const MeshSpec m = make_mesh_spec("", "tensor", "", 0, false, kCpu0);
  EXPECT_EQ(m.mode, SplitMode::Tensor);
  EXPECT_EQ(m.n_ranks(), 1u);
  EXPECT_EQ(m.ratios, std::vector<double>{1.0});
}

TEST(MeshSpecBuild, BadFlagsAreReported) {
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:1", "diagonal", "", 0, false, kCpu0); }),
                  {"--split-mode", "'diagonal'"});
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,tpu:1", "tensor", "", 0, false, kCpu0); }),
                  {"--devices", "'tpu:1'"});
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,,cpu:1", "tensor", "", 0, false, kCpu0); }),
                  {"--devices", "empty"});
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:0", "tensor", "", 0, false, kCpu0); }),
                  {"--devices", "twice"});
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:1", "tensor", "3,a", 0, false, kCpu0); }),
                  {"--tensor-split", "'a'"});
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:1", "tensor", "1,1,1", 0, false, kCpu0); }),
                  {"--tensor-split", "3 ratios for 2 devices"});
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:1", "tensor", "0,0", 0, false, kCpu0); }),
                  {"--tensor-split", "positive"});
  // Ratios are checked even in mode none, where they are not used: a typo should not pass silently.
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:1", "none", "1,x", 0, false, kCpu0); }),
                  {"--tensor-split", "'x'"});
}

TEST(MeshSpecBuild, MainDeviceOutOfRange) {
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:1", "tensor", "", 2, false, kCpu0); }),
                  {"--main-device", "2 is out of range for 2 devices", "cpu:0,cpu:1", "from 0 to 1"});
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cpu:1", "row", "", -1, false, kCpu0); }),
                  {"--main-device", "-1"});
  // Without --devices the list is the one default device.
  expect_mentions(error_of([] { make_mesh_spec("", "none", "", 1, false, kCpu0); }),
                  {"--main-device", "1 is out of range for 1 device"});
}

TEST(MeshSpecBuild, MixedCpuAndCuda) {
  expect_mentions(error_of([] { make_mesh_spec("cpu:0,cuda:0", "tensor", "", 0, false, kCpu0); }),
                  {"--devices", "'cpu:0,cuda:0'", "mixes CPU and CUDA"});
}

TEST(MeshSpecBuild, MissingCudaDevice) {
  const int n = device_count(DeviceKind::CUDA);
  // Every GPU of the machine and one more, at least two: cuda:0,cuda:1 on a machine without GPUs.
  std::string list = "cuda:0";
  for (int i = 1; i <= std::max(n, 1); ++i) list += ",cuda:" + std::to_string(i);
  const std::string msg = error_of([&] { make_mesh_spec(list, "tensor", "", 0, false, kCpu0); });
  expect_mentions(msg, {"--devices", "does not exist"});
  EXPECT_NE(msg.find("cuda:" + std::to_string(n)), std::string::npos) << msg;
#if !defined(TANDEM_HAVE_CUDA)
  expect_mentions(msg, {"no CUDA support"});
  // The default device (no --devices) is checked too, without a --devices prefix.
  const std::string dflt = error_of([] { make_mesh_spec("", "", "", 0, false, kCuda0); });
  expect_mentions(dflt, {"cuda:0", "no CUDA support"});
  EXPECT_EQ(dflt.find("--devices"), std::string::npos) << dflt;
#endif
}

}  // namespace
}  // namespace tandem
