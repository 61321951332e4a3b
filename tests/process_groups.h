#pragma once

// Process groups for the tests: a free loopback port, and several ranks of one c10d
// group run as threads of the test process.

#include <stowage/dist/process_group.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include <stdlib.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace stowage::testing {

// LibTorch 2.11's flight recorder, one per process, adds a group's entry to its map before
// it takes its lock (c10d/FlightRecorderDetail.hpp, recordWithResetEnabled): ranks run as
// threads of one process, each with its own group, race there and crash (ZeroResume: 1 run
// in 2 on an idle machine). It reads TORCH_FR_BUFFER_SIZE once, when first used; 0 turns it
// off. Set before main(), unless the environment sets it.
inline const bool kFlightRecorderOffForThreadRanks = [] { return setenv("TORCH_FR_BUFFER_SIZE", "0", 0) == 0; }();

// A loopback port the kernel reports free now, for a TCPStore to bind moments later.
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  // Unbound, the socket's name would be port 0 too.
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return 0;
  }
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
}

// Runs body(group) on `ranks` threads, each rank r of one group (Gloo over loopback),
// and rethrows the lowest rank's exception once every thread has ended. A rank that
// throws fails the group, so the others stop at their next collective instead of
// waiting for it.
inline void run_ranks(int64_t ranks, const std::function<void(const dist::ProcessGroup&)>& body) {
  const int port = free_port();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        const dist::ProcessGroup group = dist::init_process_group(
            "127.0.0.1", port, rank, ranks,
            dist::ProcessGroupOptions().timeout(std::chrono::seconds(60)).check_in_timeout(std::chrono::seconds(5)));
        body(group);
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace stowage::testing
