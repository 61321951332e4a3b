#pragma once

// Plans and write results as bytes, to move between the ranks of one job (not a stored
// format: every rank runs the same build).

#include <stowage/dcp/planner.h>

#include <string>
#include <vector>

namespace stowage::dcp::detail {

std::string encode_save_plan(const SavePlan& plan);
SavePlan decode_save_plan(const std::string& bytes);
std::string encode_write_results(const std::vector<WriteResult>& results);
std::vector<WriteResult> decode_write_results(const std::string& bytes);

}  // namespace stowage::dcp::detail
