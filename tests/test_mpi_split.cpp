// Tensor and layer splits over ranks in separate processes (`mpirun -np N tandem ...`,
// src/parallel/process_world.h), end to end on CPU ranks with the real MPI library: every process loads its
// shard; a tensor split's all-reduces go over MPI and its logits are all-gathered; a layer split's hidden
// state and logits are broadcast; rank 0 prints. The MPI comm sums in rank order like the in-process cpu
// comm, so the output must equal the in-process split's to the last printed digit (perplexity) and the
// single-process run's greedy text. Bad launches must fail with a clear error, not hang.
//
// Needs Open MPI's mpirun (scripts/setup.sh installs it); built only into the tests when CMake found MPI.
#include <gtest/gtest.h>

#include <string>

#include "test_cli_util.h"

namespace tandem {
namespace {

const std::string kShipped = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";

// Open MPI refuses to start as root unless told; CI containers run as root. `timeout` turns a hang into a
// failure (exit code 124) instead of a stuck test.
std::string mpirun(int n) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np " +
         std::to_string(n) + " --oversubscribe " + std::string(TANDEM_BIN) + " ";
}

std::string cpu_devices(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? ",cpu:" : "cpu:") + std::to_string(i);
  return s;
}

class MpiSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    const test::CommandResult v = test::run_command("mpirun --version");
    ASSERT_EQ(v.exit_code, 0) << "tandem was built with MPI but mpirun does not run (install openmpi-bin):\n"
                              << v.out;
    ASSERT_NE(v.out.find("Open MPI"), std::string::npos) << "these tests drive Open MPI's mpirun:\n" << v.out;
  }
};

class MpiSplitModes : public MpiSplit, public ::testing::WithParamInterface<std::string> {};

TEST_P(MpiSplitModes, GenerateOverProcessesGivesTheSingleProcessText) {
  const std::string args =
      "generate -m '" + kShipped + "' -p 'The capital of France is' -n 12 --temp 0 --ignore-eos -t 1 ";
  const test::CommandResult single = test::run_tandem(args, test::Stderr::Discard);
  ASSERT_EQ(single.exit_code, 0) << single.out;
  ASSERT_GT(single.out.size(), 10u);
  for (int n : {2, 4}) {
    const std::string flags = "--devices " + cpu_devices(n) + " --split-mode " + GetParam();
    const test::CommandResult r = test::run_command(mpirun(n) + args + flags, test::Stderr::Discard);
    EXPECT_EQ(r.exit_code, 0) << n << " processes\n" << r.out;
    EXPECT_EQ(r.out, single.out) << n << " processes: only rank 0 prints, and it prints the same text";
  }
}

TEST_P(MpiSplitModes, PerplexityOverProcessesEqualsTheInProcessSplit) {
  for (int n : {2, 3}) {
    const std::string args = "perplexity -m '" + kShipped + "' -f '" + std::string(TANDEM_SOURCE_DIR) +
                             "/README.md' --ctx 128 -t 1 --no-progress --devices " + cpu_devices(n) +
                             " --split-mode " + GetParam() +
                             (GetParam() == "tensor" && n == 3 ? " --tensor-split 2,1,1" : "");
    const test::CommandResult threads = test::run_tandem(args, test::Stderr::Discard);
    ASSERT_EQ(threads.exit_code, 0) << threads.out;
    ASSERT_NE(threads.out.find("PPL = "), std::string::npos) << threads.out;
    const test::CommandResult procs = test::run_command(mpirun(n) + args, test::Stderr::Discard);
    EXPECT_EQ(procs.exit_code, 0) << n << " processes\n" << procs.out;
    EXPECT_EQ(procs.out, threads.out) << n << " processes";
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, MpiSplitModes, ::testing::Values("tensor", "layer"));

TEST_F(MpiSplit, ADeviceListThatDoesNotMatchTheProcessesIsAnError) {
  const std::string args = "generate -m '" + kShipped + "' -p x -n 2 -t 1 --split-mode tensor --devices ";
  const test::CommandResult r = test::run_command(mpirun(2) + args + cpu_devices(3));
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.exit_code, 124) << "timed out: the processes hung instead of failing\n" << r.out;
  EXPECT_NE(r.out.find("error: --devices lists 3 devices, but mpirun started 2 processes"), std::string::npos)
      << r.out;
}

TEST_F(MpiSplit, RowSplitOverProcessesIsRefusedWithTheReason) {
  const std::string args = "generate -m '" + kShipped + "' -p x -n 2 -t 1 --split-mode row --devices ";
  const test::CommandResult r = test::run_command(mpirun(2) + args + cpu_devices(2));
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.exit_code, 124) << r.out;
  EXPECT_NE(
      r.out.find("error: --split-mode row: ranks in separate processes (mpirun) run tensor and layer splits"),
      std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace tandem
