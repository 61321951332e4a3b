#pragma once

// Where detected hazards go. One found on the calling thread is thrown there; one found
// by a stream's worker is kept and thrown by the next simulator call on the host
// (throw_pending_hazard), the way an asynchronous device error surfaces at the next API
// call. Every hazard is also listed for hazards().

#include <string>
#include <vector>

namespace stowage::sim::detail {

// Lists the hazard and throws it as a SimHazardError.
[[noreturn]] void raise_hazard(const std::string& message);
// Lists the hazard and keeps it for the next throw_pending_hazard(). Never throws.
void defer_hazard(const std::string& message) noexcept;
// Throws the oldest hazard deferred since the last call, if any.
void throw_pending_hazard();

std::vector<std::string> listed_hazards();
void clear_listed_hazards();

}  // namespace stowage::sim::detail
