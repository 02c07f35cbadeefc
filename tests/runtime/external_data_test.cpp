// ONNX external data (tpuhal/rt/compile.hpp): tensors whose bytes lie in a
// file next to the model (TensorProto.data_location EXTERNAL, with
// "location", "offset" and "length" entries, as onnx.save_model(...,
// save_as_external_data=True) writes them). A model with external weights
// compiles to the same results as the model with them inside; each bad
// location, file or length is refused with an error naming the tensor and
// the location.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "beneath.hpp"
#include "tpuhal/error.hpp"
#include "tpuhal/rt/compile.hpp"
#include "tpuhal/rt/model.hpp"
#include "tpuhal/tpuhal.hpp"

namespace tpuhal::rt {
namespace {

namespace fs = std::filesystem;
using Vec = std::vector<float>;

// x[2, 6] -> Reshape to [2, 2, 3] -> MatMul w[3, 4] -> Add b[4] -> Relu:
// float and int64 initializers, all with raw_data.
struct Net {
  Vec w{0.5f, -1.0f, 0.25f, 2.0f, 1.5f, 0.75f, -0.5f, 1.0f, -2.0f, 0.125f, 1.0f, -0.25f};
  Vec b{0.1f, -0.2f, 0.3f, -0.4f};
  std::vector<std::int64_t> shape{2, 2, 3};

  static void raw(onnx::TensorProto* t, const std::string& name, int type, std::vector<std::int64_t> dims,
                  const void* data, std::size_t bytes) {
    t->set_name(name);
    t->set_data_type(type);
    for (auto d : dims) t->add_dims(d);
    t->set_raw_data(std::string(static_cast<const char*>(data), bytes));
  }

  onnx::ModelProto model() const {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(13);
    auto* g = m.mutable_graph();
    g->set_name("external");
    auto* x = g->add_input();
    x->set_name("x");
    auto* xt = x->mutable_type()->mutable_tensor_type();
    xt->set_elem_type(onnx::TensorProto::FLOAT);
    for (std::int64_t d : {2, 6}) xt->mutable_shape()->add_dim()->set_dim_value(d);
    auto* y = g->add_output();
    y->set_name("y");
    y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    raw(g->add_initializer(), "w", onnx::TensorProto::FLOAT, {3, 4}, w.data(), w.size() * 4);
    raw(g->add_initializer(), "b", onnx::TensorProto::FLOAT, {4}, b.data(), b.size() * 4);
    raw(g->add_initializer(), "shape", onnx::TensorProto::INT64, {3}, shape.data(), shape.size() * 8);
    auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
      auto* n = g->add_node();
      n->set_op_type(op);
      n->set_name(op);
      for (const auto& i : in) n->add_input(i);
      n->add_output(out);
    };
    node("Reshape", {"x", "shape"}, "r");
    node("MatMul", {"r", "w"}, "m");
    node("Add", {"m", "b"}, "a");
    node("Relu", {"a"}, "y");
    return m;
  }

  Vec reference(const Vec& x) const {
    Vec y(16);
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t j = 0; j < 4; ++j) {
        float acc = 0;
        for (std::size_t k = 0; k < 3; ++k) acc += x[r * 3 + k] * w[k * 4 + j];
        y[r * 4 + j] = std::max(acc + b[j], 0.0f);
      }
    return y;
  }
};

void set_entry(onnx::TensorProto* t, const std::string& key, const std::string& value) {
  for (auto& e : *t->mutable_external_data())
    if (e.key() == key) {
      e.set_value(value);
      return;
    }
  auto* e = t->add_external_data();
  e->set_key(key);
  e->set_value(value);
}

// Moves every initializer's raw_data into `dir / location`, one after the
// other, as onnx.save_model(..., all_tensors_to_one_file=True) does; the
// last one without a "length" (it runs to the end of the file), and keys
// the loader does not use ("checksum" and an unknown one) on the first.
void externalize(onnx::ModelProto& m, const fs::path& dir, const std::string& location) {
  std::ofstream out(dir / location, std::ios::binary);
  std::uint64_t offset = 0;
  auto* inits = m.mutable_graph()->mutable_initializer();
  for (int i = 0; i < inits->size(); ++i) {
    auto* t = inits->Mutable(i);
    const std::string data = t->raw_data();
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    t->clear_raw_data();
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    set_entry(t, "location", location);
    set_entry(t, "offset", std::to_string(offset));
    if (i + 1 < inits->size()) set_entry(t, "length", std::to_string(data.size()));
    if (i == 0) {
      set_entry(t, "checksum", "0123456789abcdef0123456789abcdef01234567");
      set_entry(t, "comment", "ignored");
    }
    offset += data.size();
  }
}

onnx::TensorProto* initializer(onnx::ModelProto& m, const std::string& name) {
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    if (t.name() == name) return &t;
  return nullptr;
}

std::vector<std::byte> bytes_of(const onnx::ModelProto& m) {
  const std::string s = m.SerializeAsString();
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

Vec run(const CompileResult& r, const Vec& x) {
  Device dev = open("sim:0");
  Model m = Model::load(dev, r.model);
  Instance inst = m.instance();
  Vec in = x, y(16);
  inst.run({host(in)}, {host(y)});
  return y;
}

class ExternalData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tpuhal_external_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The net with its weights in dir_/weights.bin, saved as dir_/net.onnx
  // after `edit` changed it.
  fs::path save(const std::function<void(onnx::ModelProto&)>& edit = nullptr) {
    onnx::ModelProto m = net_.model();
    externalize(m, dir_, "weights.bin");
    if (edit) edit(m);
    const fs::path p = dir_ / "net.onnx";
    std::ofstream(p, std::ios::binary) << m.SerializeAsString();
    return p;
  }

  // Compiling `path` throws `status` with every one of `parts` in its message.
  static void expect_refused(const fs::path& path, Status status, const std::vector<std::string>& parts) {
    try {
      compile_onnx(path, CompileOptions{});
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), status) << e.what();
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
  Net net_;
};

TEST_F(ExternalData, GivenWeightsInAnExternalFileWhenCompiledFromThePathThenResultsMatchTheEmbeddedModel) {
  const Vec x{1, -2, 3, 0.5f, -1, 2, -3, 1, 0.25f, 2, -0.5f, 1};
  const Vec embedded = run(compile_onnx(bytes_of(net_.model()), CompileOptions{}, "net.onnx"), x);
  const Vec external = run(compile_onnx(save(), CompileOptions{}), x);
  EXPECT_EQ(external, embedded);
  const Vec want = net_.reference(x);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(embedded[i], want[i], 1e-5) << i;
}

TEST_F(ExternalData, GivenWeightsInASubdirectoryWhenCompiledFromARelativePathThenTheyAreFound) {
  fs::create_directories(dir_ / "data");
  onnx::ModelProto m = net_.model();
  externalize(m, dir_ / "data", "weights.bin");
  for (auto& t : *m.mutable_graph()->mutable_initializer()) set_entry(&t, "location", "./data/weights.bin");
  std::ofstream(dir_ / "net.onnx", std::ios::binary) << m.SerializeAsString();
  const Vec x(12, 1.0f);
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  Vec got;
  EXPECT_NO_THROW(got = run(compile_onnx(fs::path("net.onnx"), CompileOptions{}), x));
  fs::current_path(cwd);
  EXPECT_EQ(got, run(compile_onnx(bytes_of(net_.model()), CompileOptions{}), x));
}

TEST_F(ExternalData, GivenExternalWeightsWhenCompiledFromBytesThenTheErrorSaysToUseThePathOrADirectory) {
  save();
  std::ifstream in(dir_ / "net.onnx", std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto bytes = std::as_bytes(std::span(s.data(), s.size()));
  try {
    compile_onnx(bytes, CompileOptions{}, "net.onnx");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("initializer 'w' keeps its data in the external file 'weights.bin'"), std::string::npos) << m;
    EXPECT_NE(m.find("compile the model from its file path"), std::string::npos) << m;
    EXPECT_NE(m.find("CompileOptions::external_data_dir"), std::string::npos) << m;
  }
  CompileOptions o;
  o.external_data_dir = dir_;
  const Vec x(12, 0.5f);
  EXPECT_EQ(run(compile_onnx(bytes, o, "net.onnx"), x), run(compile_onnx(bytes_of(net_.model()), CompileOptions{}), x));
}

TEST_F(ExternalData, GivenAnAbsoluteLocationWhenCompiledThenInvalidArgumentNamesTheTensorAndLocation) {
  const std::string abs = (dir_ / "weights.bin").string();
  expect_refused(save([&](onnx::ModelProto& m) { set_entry(initializer(m, "b"), "location", abs); }),
                 Status::InvalidArgument,
                 {"net.onnx: initializer 'b': its external data '" + abs + "' is an absolute path"});
}

TEST_F(ExternalData, GivenALocationOutsideTheModelsDirectoryWhenCompiledThenInvalidArgumentNamesIt) {
  expect_refused(save([](onnx::ModelProto& m) { set_entry(initializer(m, "w"), "location", "sub/../../weights.bin"); }),
                 Status::InvalidArgument,
                 {"initializer 'w'", "'sub/../../weights.bin'", "leaves the model's directory"});
}

TEST_F(ExternalData, GivenAMissingFileWhenCompiledThenNotFoundNamesTheTensorAndPath) {
  expect_refused(save([](onnx::ModelProto& m) { set_entry(initializer(m, "shape"), "location", "gone.bin"); }),
                 Status::NotFound, {"initializer 'shape'", "'gone.bin'", "no file", "gone.bin"});
}

TEST_F(ExternalData, GivenAShortFileWhenCompiledThenInvalidArgumentSaysTheBytesRunPastItsEnd) {
  const fs::path p = save();
  fs::resize_file(dir_ / "weights.bin", 50);  // w: 48 bytes at 0, b: 16 at 48
  expect_refused(p, Status::InvalidArgument,
                 {"initializer 'b'", "'weights.bin'", "bytes 48 to 64 run past the end of the file (50 bytes)"});
  fs::resize_file(dir_ / "weights.bin", 40);
  expect_refused(p, Status::InvalidArgument, {"initializer 'w'", "bytes 0 to 48 run past the end"});
}

TEST_F(ExternalData, GivenAnOffsetPastTheEndWhenCompiledThenInvalidArgumentSaysSo) {
  expect_refused(save([](onnx::ModelProto& m) { set_entry(initializer(m, "shape"), "offset", "1000"); }),
                 Status::InvalidArgument,
                 {"initializer 'shape'", "'weights.bin'", "offset 1000 is past the end of the file (88 bytes)"});
}

TEST_F(ExternalData, GivenALengthOtherThanTheTensorsSizeWhenCompiledThenInvalidArgumentGivesBoth) {
  expect_refused(save([](onnx::ModelProto& m) { set_entry(initializer(m, "w"), "length", "44"); }),
                 Status::InvalidArgument,
                 {"initializer 'w'", "'weights.bin'", "is 44 bytes ('length'); its shape [3, 4] of FLOAT needs 48"});
  // Without a length, the rest of the file: the last tensor moved 8 bytes
  // earlier takes 32.
  expect_refused(save([](onnx::ModelProto& m) { set_entry(initializer(m, "shape"), "offset", "56"); }),
                 Status::InvalidArgument,
                 {"initializer 'shape'", "is 32 bytes (from offset 56 to the end of the file)", "of INT64 needs 24"});
  expect_refused(save([](onnx::ModelProto& m) { set_entry(initializer(m, "b"), "length", "16 bytes"); }),
                 Status::InvalidArgument,
                 {"initializer 'b': its external data 'length' is '16 bytes', not a byte count"});
}

// Symbolic links are refused wherever they point (beneath.hpp): one that
// leads out of the directory would copy another user's file into the model.
TEST_F(ExternalData, GivenASymlinkToAFileOutsideTheModelsDirectoryWhenCompiledThenItIsRefusedNamingIt) {
  const fs::path p = save();
  const fs::path outside = dir_.string() + "_outside";
  fs::create_directories(outside);
  fs::rename(dir_ / "weights.bin", outside / "secret.bin");
  fs::create_symlink(outside / "secret.bin", dir_ / "weights.bin");
  expect_refused(p, Status::InvalidArgument,
                 {"initializer 'w': its external data 'weights.bin': " + (dir_ / "weights.bin").string() +
                  " is, or lies under, a symbolic link"});
  fs::remove_all(outside);
}

TEST_F(ExternalData, GivenALocationThroughASymlinkedDirectoryWhenCompiledThenItIsRefused) {
  const fs::path outside = dir_.string() + "_outside";
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, dir_ / "data");
  onnx::ModelProto m = net_.model();
  externalize(m, outside, "weights.bin");
  for (auto& t : *m.mutable_graph()->mutable_initializer()) set_entry(&t, "location", "data/weights.bin");
  std::ofstream(dir_ / "net.onnx", std::ios::binary) << m.SerializeAsString();
  expect_refused(dir_ / "net.onnx", Status::InvalidArgument,
                 {"initializer 'w'", "'data/weights.bin'", "is, or lies under, a symbolic link"});
  fs::remove_all(outside);
}

TEST_F(ExternalData, GivenASymlinkToAFileInsideTheDirectoryWhenCompiledThenItIsRefusedToo) {
  const fs::path p = save();
  fs::rename(dir_ / "weights.bin", dir_ / "real.bin");
  fs::create_symlink("real.bin", dir_ / "weights.bin");
  expect_refused(p, Status::InvalidArgument, {"'weights.bin'", "is, or lies under, a symbolic link"});
}

TEST_F(ExternalData, GivenAFifoWhenCompiledThenItIsRefusedWithoutBlocking) {
  const fs::path p = save();
  fs::remove(dir_ / "weights.bin");
  ASSERT_EQ(::mkfifo((dir_ / "weights.bin").c_str(), 0600), 0);
  expect_refused(p, Status::InvalidArgument, {"'weights.bin'", "is not a regular file"});
}

// open_beneath itself, by openat2 where the kernel has it and by the walk
// that stands in where it does not: the same answers.
TEST_F(ExternalData, GivenEitherResolutionWhenOpeningBeneathThenOnlyPlainPathsInsideOpen) {
  const fs::path outside = dir_.string() + "_outside";
  fs::create_directories(outside);
  fs::create_directories(dir_ / "sub");
  std::ofstream(dir_ / "sub" / "w.bin") << "w";
  std::ofstream(outside / "secret.bin") << "s";
  fs::create_symlink(outside / "secret.bin", dir_ / "out.bin");
  fs::create_symlink("sub/w.bin", dir_ / "in.bin");
  fs::create_directory_symlink(outside, dir_ / "linked");
  fs::create_directory_symlink("sub", dir_ / "sub_link");
  const detail::UniqueFd dir(::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_GE(dir.get(), 0);
  for (auto how : {detail::Resolve::Auto, detail::Resolve::Walk}) {
    SCOPED_TRACE(how == detail::Resolve::Auto ? "auto" : "walk");
    auto open = [&](const char* rel) {
      const int fd = detail::open_beneath(dir.get(), rel, how);
      if (fd >= 0) ::close(fd);
      return fd >= 0 ? 0 : -fd;
    };
    EXPECT_EQ(open("sub/w.bin"), 0);
    EXPECT_EQ(open("./sub/./w.bin"), 0);
    EXPECT_EQ(open("out.bin"), ELOOP);
    EXPECT_EQ(open("in.bin"), ELOOP);
    EXPECT_EQ(open("linked/secret.bin"), ELOOP);
    EXPECT_EQ(open("sub_link/w.bin"), ELOOP);
    EXPECT_EQ(open("sub/../sub/w.bin"), EXDEV);
    EXPECT_EQ(open("../secret.bin"), EXDEV);
    EXPECT_EQ(open((outside / "secret.bin").c_str()), EXDEV);
    EXPECT_EQ(open("sub/gone.bin"), ENOENT);
    EXPECT_EQ(open("sub/w.bin/x"), ENOTDIR);
  }
  fs::remove_all(outside);
}

TEST_F(ExternalData, GivenAModelFileOver2GiBWhenCompiledThenTheErrorSuggestsExternalData) {
  const fs::path p = dir_ / "huge.onnx";
  std::ofstream(p, std::ios::binary) << "x";
  fs::resize_file(p, (std::uint64_t{1} << 31) + 16);  // sparse: no disk used
  expect_refused(p, Status::InvalidArgument, {"huge.onnx", "over 2 GiB", "save_as_external_data=True"});
}

}  // namespace
}  // namespace tpuhal::rt
