#include "sim/hazards.h"

#include <stowage/sim/sim.h>

#include <deque>
#include <mutex>

namespace stowage::sim::detail {
namespace {

std::mutex g_hazard_mutex;          // guards both below
std::vector<std::string> g_listed;  // every hazard since the last clear
std::deque<std::string> g_pending;  // deferred, not yet thrown

}  // namespace

void raise_hazard(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(g_hazard_mutex);
    g_listed.push_back(message);
  }
  throw SimHazardError(message);
}

void defer_hazard(const std::string& message) noexcept {
  try {
    std::lock_guard<std::mutex> lock(g_hazard_mutex);
    g_listed.push_back(message);
    g_pending.push_back(message);
  } catch (...) {  // out of memory while reporting: the hazard is lost, the worker lives
  }
}

void throw_pending_hazard() {
  std::string message;
  {
    std::lock_guard<std::mutex> lock(g_hazard_mutex);
    if (g_pending.empty()) return;
    message = std::move(g_pending.front());
    g_pending.pop_front();
  }
  throw SimHazardError(message);
}

std::vector<std::string> listed_hazards() {
  std::lock_guard<std::mutex> lock(g_hazard_mutex);
  return g_listed;
}

void clear_listed_hazards() {
  std::lock_guard<std::mutex> lock(g_hazard_mutex);
  g_listed.clear();
  g_pending.clear();
}

}  // namespace stowage::sim::detail
