// `tandem diffuse` (tools/tandem/cmd_diffuse.cpp, diffuse_options.cpp, diffuse_replay.cpp): bad flags give
// one clear error naming the flag before any file is read; a model that is not a canvas model is refused with
// its path; the hidden replay mode runs the sampler over recorded logits and writes its JSON trace.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "test_cli_util.h"

namespace tandem {
namespace {

using test::run_tandem;

void expect_error(const std::string& args, const std::string& needle) {
  const auto r = run_tandem(args);
  EXPECT_GT(r.exit_code, 0) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
}

const std::string kSmall = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-small-q8_0.gguf";

TEST(DiffuseCli, BadFlagsNameTheFlag) {
  expect_error("diffuse -p hi --diffusion-kv-cache maybe",
               "--diffusion-kv-cache must be auto, on or off, got 'maybe'");
  expect_error("diffuse -p hi --diffusion-gpu-sampling 1",
               "--diffusion-gpu-sampling must be auto, on or off");
  expect_error("diffuse -p hi --diffusion-gpu-sample-reduce yes",
               "--diffusion-gpu-sample-reduce must be auto, on or off");
  expect_error("diffuse -p hi --diffusion-kv-type f8",
               "--diffusion-kv-type must be auto, f32, f16 or bf16, got 'f8'");
  expect_error("diffuse -p hi --diffusion-steps -1", "--diffusion-steps must be in [0, 100000]");
  expect_error("diffuse -p hi --diffusion-blocks -2", "--diffusion-blocks must be in [0, ");
  expect_error("diffuse -p hi --diffusion-eb off",
               "--diffusion-eb off: the entropy-bound sampler is the only");
  expect_error("diffuse -p hi --diffusion-t-min 0.9 --diffusion-t-max 0.5",
               "--diffusion-t-min must be below --diffusion-t-max");
  expect_error("diffuse -p hi --diffusion-entropy-bound 0",
               "--diffusion-entropy-bound must be a finite number > 0");
  expect_error("diffuse -p hi --diffusion-confidence-threshold nan",
               "--diffusion-confidence-threshold must be a finite");
  expect_error("diffuse -p hi --diffusion-stability-threshold -3",
               "--diffusion-stability-threshold must be >= 0");
  expect_error("diffuse -p hi --diffusion-t-min -0.5", "--diffusion-t-min must be a finite number >= 0");
  expect_error("diffuse -p hi -n 0", "-n must be in [1, ");
  expect_error("diffuse -p hi --seed -2", "--seed must be >= 0, or -1");
  expect_error("diffuse -p hi --seed 4294967296", "--seed must be below 2^32");
  expect_error("diffuse", "give a prompt with -p");
  expect_error("diffuse -p hi --prompt-ids 1,2", "either as text (-p) or as ids");
  expect_error("diffuse -p hi -t -1", "--threads must be in [0, 1024]");
  // generate checks the same flags before it reads the model
  expect_error("generate -p hi -n 1 --diffusion-kv-cache sometimes",
               "--diffusion-kv-cache must be auto, on or off");
}

TEST(DiffuseCli, ANonCanvasModelIsRefusedWithItsPath) {
  const auto r = run_tandem("diffuse -m " + kSmall + " -p hi -n 4");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("tandem-small-q8_0.gguf' cannot run canvas diffusion"), std::string::npos) << r.out;
  const auto b = run_tandem("bench -m " + kSmall + " --diffusion -p 8 -r 1 --device cpu");
  EXPECT_EQ(b.exit_code, 1) << b.out;
  EXPECT_NE(b.out.find("bench --diffusion: '" + kSmall + "' cannot run canvas diffusion"), std::string::npos)
      << b.out;
  expect_error("bench --diffusion", "--diffusion needs the canvas model with -m");
  expect_error("bench -m " + kSmall + " --diffusion --diffusion-steps -4",
               "--diffusion-steps must be in [0, 100000]");
  // generate on the same model still runs autoregressively (not routed)
  EXPECT_EQ(run_tandem("generate -m " + kSmall + " --prompt-ids 1,2 -n 2 --ids --temp 0").exit_code, 0);
}

const std::string kCanvas = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-diffusion-q8_0.gguf";

// What a user gets wrong with a real canvas model: each is one clear error naming the file, flag or value
// (exit 1, no crash); --diffusion-steps 0 means the model's default; --visual and the device reduction asked
// for where they cannot run are notes, and the run goes on.
TEST(DiffuseCli, BadInputsWithTheShippedCanvasModel) {
  expect_error("diffuse -m /nonexistent/dir/model.gguf -p hi", "/nonexistent/dir/model.gguf");
  {
    const std::string junk = (std::filesystem::temp_directory_path() /
                              ("tandem_diffuse_junk_" + std::to_string(::getpid()) + ".gguf"))
                                 .string();
    std::ofstream(junk) << "this is not a GGUF file";
    expect_error("diffuse -m " + junk + " -p hi", junk);
    std::filesystem::remove(junk);
  }
  // A prompt longer than the positions the canvas runner holds before its canvas (2048).
  std::string ids = "1";
  for (int i = 0; i < 2100; ++i) ids += ",1";
  expect_error("diffuse -m " + kCanvas + " --prompt-ids " + ids + " -n 4 --seed 1",
               "the prompt has 2101 tokens, more than the 2048 positions");
  expect_error("diffuse -m " + kCanvas + " --prompt-ids 1,99999999 -n 4 --seed 1", "outside the vocabulary");
  expect_error("diffuse -m " + kCanvas + " --prompt-ids 1,x -n 4", "'x' is not a token id");
  expect_error("diffuse -m " + kCanvas + " -p '' -n 4", "give a prompt with -p");
  expect_error("diffuse -m " + kCanvas + " -p hi --devices cuda:97", "cuda:97");
  expect_error("diffuse -m " + kCanvas + " -p hi --split-mode sideways --devices cpu:0,cpu:1", "sideways");
  expect_error("diffuse -m " + kCanvas + " -p hi --chat-template /nonexistent/t.jinja",
               "/nonexistent/t.jinja");
  // The model's t_max with a --diffusion-t-min above it: the message says the two were combined.
  expect_error("diffuse -m " + kCanvas + " -p hi -n 4 --diffusion-t-min 5",
               "combined with the --diffusion-* flags");

  // --diffusion-steps 0: the model's own step count (diffusion.eb_max_steps, else 48) is used.
  const auto r = run_tandem("diffuse -m " + kCanvas +
                                " --prompt-ids 1,2,3 -n 4 --seed 1 --ids --diffusion-steps 0 --visual "
                                "--diffusion-gpu-sample-reduce on -t 2",
                            test::Stderr::Merge);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--visual is off: stdout is not a terminal"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sampling reduction on the host"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("0 steps at most"), std::string::npos) << r.out;
}

// `bench --diffusion` on the shipped canvas model (CPU): the table of both paths and the bytes a step reads.
TEST(DiffuseCli, BenchDiffusionReportsBothPathsAndTheBytesPerStep) {
  const auto r = run_tandem("bench -m " + kCanvas +
                            " --diffusion -p 8 --diffusion-steps 2 -r 1 --device cpu -t 2 --bw 100");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("| host reduction | host |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| device reduction | host |"), std::string::npos) << r.out;  // no GPU: the host path
  EXPECT_NE(r.out.find("bytes per step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("% of 100 GB/s (floor "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("K/V f32"), std::string::npos) << r.out;  // auto on the CPU: the reference's precision
  // --diffusion-kv-type: the store's precision as asked, named in the source line; a bad value is refused.
  const auto f16 = run_tandem("bench -m " + kCanvas +
                              " --diffusion -p 8 --diffusion-steps 2 -r 1 --device cpu -t 2 --diffusion-kv-type f16");
  ASSERT_EQ(f16.exit_code, 0) << f16.out;
  EXPECT_NE(f16.out.find("K/V f16"), std::string::npos) << f16.out;
  expect_error("bench -m " + kCanvas + " --diffusion -p 8 --diffusion-kv-type half",
               "--diffusion-kv-type must be auto, f32, f16 or bf16, got 'half'");
}

// tandem diffuse with an F16 K/V store on the CPU: runs, and says so in its configuration line.
TEST(DiffuseCli, AnF16StoreRunsAndIsNamed) {
  const auto r = run_tandem("diffuse -m " + kCanvas +
                                " --prompt-ids 1,2,3 -n 4 --seed 1 --ids --diffusion-steps 3 -t 2 "
                                "--diffusion-kv-type f16",
                            test::Stderr::Merge);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("K/V f16"), std::string::npos) << r.out;
}

class DiffuseReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tandem_diffuse_replay_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(uint32_t V, uint32_t C, uint32_t S, size_t truncate = 0) {
    const std::string path = (dir_ / "logits.tebl").string();
    std::ofstream f(path, std::ios::binary);
    f.write("TEBL", 4);
    const uint32_t dims[3] = {V, C, S};
    f.write(reinterpret_cast<const char*>(dims), sizeof dims);
    std::mt19937 g(3);
    std::normal_distribution<float> nd(0.0f, 4.0f);
    std::vector<float> x(size_t(V) * C * S - truncate);
    for (float& v : x) v = nd(g);
    f.write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(DiffuseReplay, WritesATraceOfEveryStep) {
  const std::string logits = write(50, 6, 5), trace = (dir_ / "t.json").string();
  const auto r = run_tandem("diffuse --replay-logits " + logits + " --trace " + trace +
                            " --seed 9 --diffusion-entropy-bound 0.3");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(trace);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["n_vocab"], 50);
  EXPECT_EQ(j["canvas_length"], 6);
  EXPECT_EQ(j["max_steps"], 5);  // the file's steps
  EXPECT_EQ(j["seed"], 9);
  ASSERT_GE(j["steps"].size(), 1u);
  const auto& last = j["steps"].back();
  EXPECT_EQ(j["final"], last["argmax"]);
  for (const auto& s : j["steps"]) {
    EXPECT_EQ(s["u"].size(), 6u);
    EXPECT_EQ(s["accepted"].size(), 6u);
    for (size_t i = 0; i < 6; ++i) {  // next = accepted ? sampled : renoise
      const bool acc = s["accepted"][i] == 1;
      EXPECT_EQ(s["next_canvas"][i], acc ? s["sampled"][i] : s["renoise"][i]);
    }
  }
  // The first input canvas is the seeded random one: the same for the same seed.
  const std::string trace2 = (dir_ / "t2.json").string();
  ASSERT_EQ(run_tandem("diffuse --replay-logits " + logits + " --trace " + trace2 +
                       " --seed 9 --diffusion-entropy-bound 0.3")
                .exit_code,
            0);
  std::ifstream in2(trace2);
  EXPECT_EQ(nlohmann::json::parse(in2), j);
}

TEST_F(DiffuseReplay, BadFilesAndFlagsAreErrors) {
  const std::string trace = (dir_ / "t.json").string();
  expect_error("diffuse --replay-logits " + write(50, 6, 5, 7) + " --trace " + trace + " --seed 1",
               "is truncated");
  expect_error("diffuse --replay-logits " + write(50, 6, 5) + " --seed 1", "needs --trace");
  expect_error(
      "diffuse --replay-logits " + write(50, 6, 5) + " --trace " + trace + " --seed 1 --diffusion-steps 9",
      "the file has 5 steps");
  const std::string junk = (dir_ / "junk").string();
  std::ofstream(junk) << "not logits at all";
  expect_error("diffuse --replay-logits " + junk + " --trace " + trace + " --seed 1", "no TEBL header");
}

}  // namespace
}  // namespace tandem
