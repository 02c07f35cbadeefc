// base::OutputFile: outputs in a directory others may write to. A link
// planted at the output's name (or at the old predictable NAME.tmp) is
// replaced, never followed; the file written is always one this process
// created.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "tpuhal/base/output_file.h"

namespace tpuhal::base {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tpuhal-output-file-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::vector<std::string> names() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
};

TEST(BaseOutputFile, GivenLinksPlantedAtTheNameAndItsTmpWhenCommittedThenTheVictimIsUntouched) {
  TempDir d;
  const fs::path victim = d.path / "victim", out = d.path / "out.json";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, out);
  fs::create_symlink(victim, d.path / "out.json.tmp");
  fs::create_hard_link(victim, d.path / "hard.json");
  {
    OutputFile f(out.string());
    EXPECT_THAT(fs::path(f.temp_path()).filename().string(), StartsWith(".out.json."));
    f.write("new ");
    f.write("content");
    f.commit();
  }
  OutputFile h((d.path / "hard.json").string());
  h.write("other");
  h.commit();
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_TRUE(fs::is_regular_file(out));
  EXPECT_EQ(slurp(out), "new content");
  EXPECT_EQ(slurp(d.path / "hard.json"), "other");
  EXPECT_EQ(fs::hard_link_count(victim), 1u);
  EXPECT_EQ(d.names(), (std::vector<std::string>{"hard.json", "out.json", "out.json.tmp", "victim"}));
}

TEST(BaseOutputFile, GivenAPublishedFileWhenWrittenOnThenTheWritesLandAtTheName) {
  TempDir d;
  const fs::path victim = d.path / "victim", out = d.path / "trace.json";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, out);
  OutputFile f(out.string());
  f.publish();
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(out)));
  f.write("[1,");
  f.write("2]");
  EXPECT_EQ(slurp(out), "[1,2]");
  f.commit();
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(d.names(), (std::vector<std::string>{"trace.json", "victim"}));
}

TEST(BaseOutputFile, GivenTheUmaskWhenCreatedThenTheModeIsWhatFopenWouldGive) {
  TempDir d;
  const mode_t old = ::umask(027);
  OutputFile f((d.path / "a").string());
  ::umask(old);
  f.commit();
  EXPECT_EQ(fs::status(d.path / "a").permissions(), fs::perms(0640));
}

TEST(BaseOutputFile, GivenAFileNeverPutInPlaceWhenDestroyedThenNothingIsLeft) {
  TempDir d;
  { OutputFile f((d.path / "a").string()); }
  EXPECT_TRUE(d.names().empty());
}

TEST(BaseOutputFile, GivenAMissingDirectoryWhenCreatedThenTheErrorNamesThePathAndTheReason) {
  try {
    OutputFile f("/nonexistent-directory/t.json");
    FAIL() << "created";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
    EXPECT_THAT(e.what(), HasSubstr("cannot create /nonexistent-directory/t.json: No such file or directory"));
  }
}

TEST(BaseOutputFile, GivenADirectoryAtTheNameWhenCommittedThenItIsRefusedAndNothingIsLeft) {
  TempDir d;
  fs::create_directory(d.path / "dir");
  OutputFile f((d.path / "dir").string());
  f.write("x");
  try {
    f.commit();
    FAIL() << "committed";
  } catch (const std::system_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot replace " + (d.path / "dir").string()));
  }
  EXPECT_EQ(d.names(), std::vector<std::string>{"dir"});
}

}  // namespace
}  // namespace tpuhal::base
