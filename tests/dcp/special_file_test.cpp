// A FIFO, socket, device node or directory where a checkpoint has a file: load and
// save refuse it at once with an error naming it, and never block in open().

#include "dcp/test_util.h"

#include <stowage/error.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

// Replaces the file at `path` by a file-system object of one kind.
struct SpecialKind {
  std::string name;                              // as the error says it: "a FIFO"
  std::function<bool(const std::string&)> make;  // false where this machine cannot
};

std::vector<SpecialKind> special_kinds() {
  return {
      {"a FIFO", [](const std::string& path) { return ::mkfifo(path.c_str(), 0644) == 0; }},
      {"a socket",
       [](const std::string& path) {
         const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
         sockaddr_un address{};
         address.sun_family = AF_UNIX;
         if (fd < 0 || path.size() >= sizeof(address.sun_path)) return false;
         std::copy(path.begin(), path.end(), address.sun_path);
         const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
         ::close(fd);  // the socket file stays
         return bound;
       }},
      {"a directory", [](const std::string& path) { return ::mkdir(path.c_str(), 0755) == 0; }},
      // /dev/null's numbers; needs CAP_MKNOD (the tests run as root).
      {"a character device",
       [](const std::string& path) { return ::mknod(path.c_str(), S_IFCHR | 0644, makedev(1, 3)) == 0; }},
  };
}

StateDict small_state(float value) {
  StateDict state;
  state.insert("w", torch::full({64}, value));
  state.insert("step", int64_t(3));
  return state;
}

// Runs `operation`, which must throw an Error whose message holds every one of
// `parts`. If it is still running after a generous minute it is blocked in open() on a
// FIFO: the FIFO's write end is opened to release it, and the test fails.
void expect_refused(const std::function<void()>& operation, const std::string& fifo_path,
                    const std::vector<std::string>& parts) {
  auto done = std::async(std::launch::async, [&] {
    try {
      operation();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    const int writer = ::open(fifo_path.c_str(), O_WRONLY | O_NONBLOCK);
    ADD_FAILURE() << "blocked in open() on " << fifo_path;
    done.wait();
    if (writer >= 0) ::close(writer);
    return;
  }
  const std::string message = done.get();
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

std::string first_data_file(const std::string& dir) {
  return dir + "/" + testing::data_files(dir).at(0);
}

// Links are refused for the files inside a checkpoint, not for the directory itself.
TEST(DcpSpecialFiles, ACheckpointDirectoryMayBeASymbolicLinkToOne) {
  const ScratchDir dir;
  ASSERT_EQ(::mkdir(dir.sub("real").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(dir.sub("real").c_str(), dir.sub("link").c_str()), 0);
  StateDict state;
  state.insert("w", torch::arange(6, torch::kFloat));
  save(state, dir.sub("link"));
  StateDict target;
  target.insert("w", torch::zeros({6}));
  load(target, dir.sub("link"));
  EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::arange(6, torch::kFloat)));
  EXPECT_TRUE(std::filesystem::exists(testing::metadata_path(dir.sub("real"))));
}

TEST(DcpSpecialFiles, ADataFileThatIsNotARegularFileFailsTheLoadAtOnceNamingIt) {
  for (const SpecialKind& kind : special_kinds()) {
    SCOPED_TRACE(kind.name);
    const ScratchDir dir;
    save(small_state(1), dir.path());
    const std::string data = first_data_file(dir.path());
    ASSERT_EQ(::unlink(data.c_str()), 0);
    if (!kind.make(data)) {
      std::cout << "cannot make " << kind.name << " here: not tested\n";
      continue;
    }
    StateDict target = small_state(-1);
    expect_refused([&] { load(target, dir.path()); }, data, {data, kind.name, "not a regular file", "'w'"});
    EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::full({64}, -1.0f)));
    EXPECT_EQ(target.at("step").toInt(), 3);
    // A new save replaces the checkpoint (and with it the object in its data file's place).
    save(small_state(2), dir.path());
    load(target, dir.path());
    EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::full({64}, 2.0f)));
  }
}

TEST(DcpSpecialFiles, MetadataThatIsNotARegularFileFailsLoadAndSaveAtOnceNamingIt) {
  for (const SpecialKind& kind : special_kinds()) {
    SCOPED_TRACE(kind.name);
    const ScratchDir dir;
    save(small_state(1), dir.path());
    const std::string metadata = testing::metadata_path(dir.path());
    ASSERT_EQ(::unlink(metadata.c_str()), 0);
    if (!kind.make(metadata)) {
      std::cout << "cannot make " << kind.name << " here: not tested\n";
      continue;
    }
    const std::vector<std::string> files_before = testing::list_files(dir.path());
    StateDict target = small_state(-1);
    expect_refused([&] { load(target, dir.path()); }, metadata, {metadata, kind.name, "not a regular file"});
    EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::full({64}, -1.0f)));
    expect_refused([&] { FileSystemReader(dir.path()).read_metadata(); }, metadata, {metadata, kind.name});
    // Saving would read it, then replace it: refused before anything is written.
    expect_refused([&] { save(small_state(2), dir.path()); }, metadata,
                   {"cannot save into", metadata, kind.name, "not a regular file"});
    FileSystemWriter writer(dir.path());
    expect_refused([&] { async_save(small_state(2), writer).upload_completion.get(); }, metadata,
                   {metadata, kind.name});
    EXPECT_EQ(testing::list_files(dir.path()), files_before);
    struct stat info {};
    ASSERT_EQ(::lstat(metadata.c_str(), &info), 0);
    EXPECT_FALSE(S_ISREG(info.st_mode));  // left as the user had it
  }
}

}  // namespace
}  // namespace stowage::dcp
