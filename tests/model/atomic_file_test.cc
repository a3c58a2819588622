// AtomicFile: the destination holds the old file or the whole new one,
// never a part; temporaries have unique names (concurrent writers of one
// path do not collide) and are never left behind; errors name the path.
#include "model/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "model/data/indexed_dataset.h"

namespace troupe::model {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("troupe_atomic_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::vector<std::string> entries() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    return out;
  }
  fs::path dir_;
};

TEST_F(AtomicFileTest, CommitPutsTheWholeFileInPlaceAndLeavesNoTemporary) {
  const std::string path = dir_ / "w.bin";
  absl::StatusOr<AtomicFile> f = AtomicFile::create(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(fs::path(f->temp_path()).parent_path(), dir_);  // same file system: rename works
  std::string big(3 << 20, 'x');                            // larger than the buffer
  ASSERT_TRUE(f->write("head:").ok());
  ASSERT_TRUE(f->write(big).ok());
  ASSERT_TRUE(f->commit().ok());
  EXPECT_EQ(read(path), "head:" + big);
  EXPECT_EQ(entries(), std::vector<std::string>{"w.bin"});
}

TEST_F(AtomicFileTest, UntilCommitTheOldFileStaysAndWithoutItNothingIsLeft) {
  const std::string path = dir_ / "w.bin";
  ASSERT_TRUE(write_file_atomically(path, "old").ok());
  {
    absl::StatusOr<AtomicFile> f = AtomicFile::create(path);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE(f->write(std::string(2 << 20, 'n')).ok());
    EXPECT_EQ(read(path), "old");  // a reader never sees a half-written file
    EXPECT_EQ(entries().size(), 2u);
  }  // destroyed without commit
  EXPECT_EQ(read(path), "old");
  EXPECT_EQ(entries(), std::vector<std::string>{"w.bin"});
}

TEST_F(AtomicFileTest, ConcurrentWritersOfOnePathGetUniqueTemporaries) {
  const std::string path = dir_ / "cache.bin";
  constexpr int kWriters = 8;
  std::vector<AtomicFile> files;
  std::set<std::string> temps;
  for (int i = 0; i < kWriters; i++) {
    absl::StatusOr<AtomicFile> f = AtomicFile::create(path);
    ASSERT_TRUE(f.ok()) << f.status();
    temps.insert(f->temp_path());
    files.push_back(*std::move(f));
  }
  EXPECT_EQ(temps.size(), static_cast<std::size_t>(kWriters));
  std::vector<absl::Status> results(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; i++) {
    threads.emplace_back([&, i] {
      const std::string content(1 << 18, static_cast<char>('a' + i));
      results[i] = files[i].write(content);
      if (results[i].ok()) results[i] = files[i].commit();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  const std::string got = read(path);
  ASSERT_EQ(got.size(), 1u << 18);
  EXPECT_EQ(got, std::string(got.size(), got[0])) << "a mix of writers";
  EXPECT_EQ(entries(), std::vector<std::string>{"cache.bin"});
}

TEST_F(AtomicFileTest, AnUnwritableDirectoryIsAnErrorNamingThePath) {
  absl::StatusOr<AtomicFile> f = AtomicFile::create("/nonexistent/dir/w.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/dir/w.safetensors: cannot create a file in "
                                      "/nonexistent/dir: No such file or directory"),
            std::string::npos)
      << f.status();
  // A parent that is a file (root ignores permission bits, so not 0555).
  ASSERT_TRUE(write_file_atomically(dir_ / "plain", "x").ok());
  const std::string under = dir_ / "plain" / "w.bin";
  absl::Status st = write_file_atomically(under, "y");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(under + ": cannot create a file in"), std::string::npos) << st;
}

// A write that fails (here: past RLIMIT_FSIZE, as a full disk would) is an
// error naming the path; the temporary is removed, the old file kept.
TEST_F(AtomicFileTest, AFailedWriteLeavesNoTemporaryAndTheOldFile) {
  const std::string path = dir_ / "w.bin";
  ASSERT_TRUE(write_file_atomically(path, "old").ok());
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1 << 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status st;
  {
    absl::StatusOr<AtomicFile> f = AtomicFile::create(path);
    ASSERT_TRUE(f.ok()) << f.status();
    st = f->write(std::string(4 << 20, 'z'));
    if (st.ok()) st = f->commit();
    EXPECT_EQ(f->commit().code(), st.code());  // the error is kept
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(path + ": cannot write: File too large"), std::string::npos) << st;
  EXPECT_EQ(read(path), "old");
  EXPECT_EQ(entries(), std::vector<std::string>{"w.bin"});
}

// Datasets go through AtomicFile too: two builders of one prefix (they
// shared "<prefix>.bin.tmp") both finish with a whole dataset, and a builder
// that never finishes leaves nothing behind.
TEST_F(AtomicFileTest, DatasetBuildersOfOnePrefixDoNotCollide) {
  const std::string prefix = dir_ / "corpus";
  // Both open before either writes; then they write and finish in turn.
  std::vector<data::IndexedDatasetBuilder> builders(2);
  for (auto& b : builders) ASSERT_TRUE(b.open(prefix, data::TokenDType::kU16).ok());
  for (int b = 0; b < 2; b++) {
    std::vector<std::int32_t> doc(1000, b + 1);
    absl::Status st;
    for (int i = 0; st.ok() && i < 200; i++) st = builders[b].add_document(doc);
    if (st.ok()) st = builders[b].finish();
    EXPECT_TRUE(st.ok()) << "builder " << b << ": " << st;
  }
  std::string last;  // builder 1's tokens, u16 little-endian: it finished last
  for (int i = 0; i < 200 * 1000; i++) last += std::string("\x02\x00", 2);
  EXPECT_TRUE(read(prefix + ".bin") == last) << "not the last builder's whole file";
  auto ds = data::IndexedDataset::open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_sequences(), 200);
  std::vector<std::string> names = entries();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"corpus.bin", "corpus.idx"}));
  {
    data::IndexedDatasetBuilder unfinished;
    ASSERT_TRUE(unfinished.open(dir_ / "partial", data::TokenDType::kI32).ok());
    ASSERT_TRUE(unfinished.add_document(std::vector<std::int32_t>(10, 3)).ok());
  }
  EXPECT_EQ(entries().size(), 2u);
}

}  // namespace
}  // namespace troupe::model
