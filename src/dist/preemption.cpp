#include <stowage/dist/preemption.h>
#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <semaphore.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <thread>

namespace stowage::dist {
namespace {

// What the signal handler touches: lock-free atomics and a semaphore, the only state a
// handler may use. They are process-wide, as signal dispositions are.
std::atomic<bool> g_notice_lives{false};  // one PreemptionNotice at a time
std::atomic<bool> g_armed{false};
std::atomic<bool> g_second_signal_exits{true};
std::atomic<int> g_first_signal{0};
// Posted by the first notice, and by disarm() and the destructor: wakes the watchdog.
sem_t g_wake_watchdog;
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "a signal handler may only use lock-free atomics");

void write_to_stderr(const char* text) {
  // The handler's output: write(2) is async-signal-safe, stdio is not.
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Ends the process as `signal`'s default action would, after `why` on stderr.
// Async-signal-safe. raise() delivers to this thread before it returns.
void die_by(int signal, const char* why) {
  write_to_stderr(why);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
  ::_exit(128 + signal);  // only if the signal is blocked here
}

extern "C" void on_notice_signal(int signal) {
  if (!g_armed.load()) return;
  const int saved_errno = errno;  // sem_post may set it under the interrupted code
  int none = 0;
  if (g_first_signal.compare_exchange_strong(none, signal)) {
    ::sem_post(&g_wake_watchdog);
    errno = saved_errno;
    return;
  }
  errno = saved_errno;
  if (g_second_signal_exits.load()) {
    die_by(signal,
           "stowage: a second preemption signal: exiting at once (a checkpoint being written is not committed)\n");
  }
}

timespec monotonic_after(std::chrono::milliseconds delay) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const auto total_ns = static_cast<int64_t>(now.tv_nsec) + (delay.count() % 1000) * 1'000'000;
  timespec deadline{};
  deadline.tv_sec = now.tv_sec + static_cast<time_t>(delay.count() / 1000 + total_ns / 1'000'000'000);
  deadline.tv_nsec = static_cast<long>(total_ns % 1'000'000'000);
  return deadline;
}

}  // namespace

struct PreemptionNotice::Rep {
  PreemptionOptions options;
  std::map<int, struct sigaction> previous;  // by signal
  std::thread watchdog;                      // with a grace deadline
  std::atomic<bool> stopping{false};

  // Waits for the first notice, then for the grace deadline, unless disarmed first.
  void watch() {
    while (::sem_wait(&g_wake_watchdog) != 0 && errno == EINTR) {
    }
    if (stopping.load()) return;
    const timespec deadline = monotonic_after(options.grace());
    while (::sem_clockwait(&g_wake_watchdog, CLOCK_MONOTONIC, &deadline) != 0) {
      if (errno != EINTR) break;  // ETIMEDOUT
    }
    if (stopping.load() || !g_armed.load()) return;
    const std::string why = fmt::format(
        "stowage: the preemption grace of {:.3g} s ran out: exiting (a checkpoint being written is not committed)\n",
        std::chrono::duration<double>(options.grace()).count());
    die_by(g_first_signal.load(), why.c_str());
  }

  void stop_watchdog() {
    if (stopping.exchange(true) || !watchdog.joinable()) return;
    ::sem_post(&g_wake_watchdog);
    watchdog.join();
  }
};

PreemptionNotice::PreemptionNotice(PreemptionOptions options) : rep_(std::make_unique<Rep>()) {
  rep_->options = std::move(options);
  if (rep_->options.grace().count() < 0) {
    throw InvalidArgument(
        fmt::format("PreemptionNotice: grace must be >= 0, got {} ms", rep_->options.grace().count()));
  }
  for (const int signal : rep_->options.signals()) {
    if (signal <= 0 || signal >= NSIG || signal == SIGKILL || signal == SIGSTOP) {
      throw InvalidArgument(fmt::format("PreemptionNotice: signal {} cannot be caught", signal));
    }
  }
  if (g_notice_lives.exchange(true)) {
    throw InvalidArgument("PreemptionNotice: another one lives in this process (signal handlers are process-wide)");
  }
  g_first_signal = 0;
  g_second_signal_exits = rep_->options.second_signal_exits();
  ::sem_init(&g_wake_watchdog, 0, 0);
  g_armed = true;
  struct sigaction action {};
  action.sa_handler = on_notice_signal;
  sigemptyset(&action.sa_mask);
  // SA_NODEFER: a second signal inside the handler's own run still ends the process.
  action.sa_flags = SA_RESTART | SA_NODEFER;
  for (const int signal : rep_->options.signals()) {
    struct sigaction previous {};
    ::sigaction(signal, &action, &previous);
    rep_->previous.emplace(signal, previous);
  }
  if (rep_->options.grace().count() > 0) rep_->watchdog = std::thread([rep = rep_.get()] { rep->watch(); });
}

PreemptionNotice::~PreemptionNotice() {
  disarm();
  for (const auto& [signal, previous] : rep_->previous) ::sigaction(signal, &previous, nullptr);
  ::sem_destroy(&g_wake_watchdog);
  g_first_signal = 0;
  g_notice_lives = false;
}

bool PreemptionNotice::received() const {
  return g_first_signal.load() != 0;
}

int PreemptionNotice::signal_number() const {
  return g_first_signal.load();
}

void PreemptionNotice::notify(int signal) {
  if (signal <= 0 || signal >= NSIG) {
    throw InvalidArgument(fmt::format("PreemptionNotice::notify: {} is not a signal number", signal));
  }
  int none = 0;
  if (g_armed.load() && g_first_signal.compare_exchange_strong(none, signal)) ::sem_post(&g_wake_watchdog);
}

bool PreemptionNotice::agreed(const std::optional<ProcessGroup>& group) const {
  if (!group) return received();
  // How many ranks got each signal; a rank without notice takes the lowest one given.
  at::Tensor ranks_by_signal = at::zeros({NSIG}, at::kInt);
  if (received()) ranks_by_signal[signal_number()] = 1;
  group->all_reduce_sum(ranks_by_signal);
  const at::Tensor given = ranks_by_signal.nonzero();
  if (given.numel() == 0) return false;
  // As notify(): the grace deadline runs from here on a rank that had no notice.
  int none = 0;
  if (g_armed.load() && g_first_signal.compare_exchange_strong(none, static_cast<int>(given[0].item<int64_t>()))) {
    ::sem_post(&g_wake_watchdog);
  }
  return true;
}

void PreemptionNotice::disarm() {
  g_armed = false;
  rep_->stop_watchdog();
}

}  // namespace stowage::dist
