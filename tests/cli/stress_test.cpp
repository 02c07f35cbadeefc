// `tpuhal stress`, the soak test, run as a user runs it: a short soak on the
// smallest board passes, and an injected fault fails it with an error that
// names the device and queue, promptly and with exit status 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "run_cli.h"

namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

using tpuhal::test::Output;
using tpuhal::test::run;

TEST(Stress, GivenTheSmallestBoardWhenSoakedByFourThreadsInTwoProcessesThenEveryByteAndCompletionChecksOut) {
  const Output r = run("stress --seconds 5 --threads 4 --processes 2 --device sim:tiny --seed 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("seed 1"));
  EXPECT_THAT(r.out, ContainsRegex("PASSED: [0-9]+ operations in [0-9.]+ s"));
  EXPECT_THAT(r.out, ContainsRegex("completions, 0 errors"));
  EXPECT_THAT(r.out, HasSubstr("failed 0, lost 0"));
  EXPECT_THAT(r.out, HasSubstr("device memory (process 0): back to where it started"));
  EXPECT_THAT(r.out, HasSubstr("device memory (process 1): back to where it started"));
  EXPECT_THAT(r.out, Not(HasSubstr("ERROR"))) << r.out;
}

TEST(Stress, GivenOneProcessWhenAskedForJsonThenTheSummaryIsOneObjectWithEveryCount) {
  const Output r = run("stress --seconds 2 --threads 2 --device sim:tiny --seed 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  // The header (the seed) goes to stderr, before the object.
  EXPECT_THAT(r.out, HasSubstr("seed 2\n"));
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find("\n{") + 1), nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["passed"], true);
  EXPECT_EQ(j["seed"], 2);
  EXPECT_EQ(j["device"], "sim:tiny");
  EXPECT_EQ(j["submitted"], j["completed"]);
  EXPECT_GT(j["submitted"].get<std::uint64_t>(), 0u);
  EXPECT_GT(j["bytes_verified"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["lost"], 0);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_EQ(j["memory_ok"], true);
  for (const char* kind : {"fill", "upload", "download", "copy", "tensor-op", "cross-wait", "free", "release"})
    EXPECT_GT(j["operations"][kind].get<std::uint64_t>(), 0u) << kind;
}

TEST(Stress, GivenHelpOrABadValueThenItSaysWhatItDoesOrWhatIsWrong) {
  const Output help = run("stress --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("Usage: tpuhal stress"));
  EXPECT_THAT(help.out, HasSubstr("--seed"));
  EXPECT_THAT(help.out, Not(HasSubstr("--child")));  // the flag it passes to its own processes
  const Output zero = run("stress --seconds 0 --device sim:tiny");
  EXPECT_EQ(zero.code, 2);
  EXPECT_THAT(zero.out, HasSubstr("--seconds must be above 0"));
  const Output none = run("stress --seconds 1 --device sim:nosuchboard");
  EXPECT_EQ(none.code, 1);
  EXPECT_THAT(none.out, HasSubstr("nosuchboard"));
}

TEST(Stress, GivenADmaErrorOnAQueueWhenSoakingThenItFailsPromptlyNamingTheDeviceAndQueue) {
  const auto start = Clock::now();
  const Output r = run("stress --seconds 60 --threads 4 --processes 2 --device sim:tiny --seed 3",
                       "TPUHAL_SIM_FAULTS=dma-error:queue=0:after=50");
  const auto took = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("tpuhal stress: ERROR"));
  EXPECT_THAT(r.out, HasSubstr("sim:tiny compute queue 0"));
  EXPECT_THAT(r.out, HasSubstr("(seed 3)"));
  EXPECT_THAT(r.out, ContainsRegex("FAILED: .* [1-9][0-9]* errors"));
  // The first error stops the run: it does not go on for the minute asked for.
  EXPECT_LT(took.count(), 40) << r.out;
}

}  // namespace
