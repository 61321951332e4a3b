#include "dcp/storage/mapped_file.h"
#include "util/errno_error.h"
#include "util/streaming_copy.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

#include <sys/mman.h>

namespace stowage::dcp::detail {
namespace {

// Set only while the thread runs a guarded read: where the SIGBUS handler resumes it.
// volatile: the read between setting and clearing it never uses it, so the compiler
// would otherwise drop the setting.
thread_local sigjmp_buf* volatile guarded_read_resume = nullptr;
struct sigaction previous_sigbus_action {};

void on_sigbus(int signal, siginfo_t* info, void* context) {
  if (sigjmp_buf* resume = guarded_read_resume) siglongjmp(*resume, 1);
  // Not a guarded read: behave as if this handler were not there.
  if ((previous_sigbus_action.sa_flags & SA_SIGINFO) != 0) {
    previous_sigbus_action.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_sigbus_action.sa_handler != SIG_DFL && previous_sigbus_action.sa_handler != SIG_IGN) {
    previous_sigbus_action.sa_handler(signal);
    return;
  }
  // The default action (a fault cannot be ignored): terminate once this handler returns.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ::sigaction(SIGBUS, &default_action, nullptr);
  std::raise(SIGBUS);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (::sigaction(SIGBUS, &action, &previous_sigbus_action) != 0) {
      util::throw_errno("cannot install the SIGBUS handler that guards reads of mapped data files", "", "sigaction",
                        errno);
    }
  });
}

// Runs `read` (plain memory reads that no exception or destructor spans, so that the
// handler may jump out of it); false if it faulted.
template <typename Read>
bool guarded(Read&& read) {
  sigjmp_buf resume;
  // The handler runs with SIGBUS blocked: sigsetjmp saves the mask so that the jump
  // back restores it.
  if (sigsetjmp(resume, 1) != 0) {
    guarded_read_resume = nullptr;
    return false;
  }
  guarded_read_resume = &resume;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  read();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded_read_resume = nullptr;
  return true;
}

}  // namespace

MappedFile::MappedFile(const File& file, int64_t length) : length_(length) {
  if (length == 0) return;
  install_sigbus_handler();
  const int64_t size = file.size();
  if (size < length) {
    throw CorruptionError(
        fmt::format("data file '{}' is truncated: it has {} bytes, {} were there when the checkpoint was opened",
                    file.path(), size, length),
        "", file.path(), size);
  }
  void* data = ::mmap(nullptr, static_cast<size_t>(length), PROT_READ, MAP_SHARED, file.fd(), 0);
  if (data == MAP_FAILED) util::throw_errno(fmt::format("cannot map '{}'", file.path()), file.path(), "mmap", errno);
  // Loads read every chunk front to back, once or twice in a row.
  ::madvise(data, static_cast<size_t>(length), MADV_SEQUENTIAL);
  data_ = static_cast<const char*>(data);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), static_cast<size_t>(length_));
}

bool guarded_hash_update(XXH3_state_t* state, const char* data, size_t length) {
  return guarded([&] { XXH3_64bits_update(state, data, length); });
}

bool guarded_copy(char* destination, const char* source, size_t length) {
  return guarded([&] { util::copy_streaming(destination, source, length); });
}

}  // namespace stowage::dcp::detail
