#pragma once

// Paths and non-tensor values as stowage's metadata stores them in JSON (docs/FORMAT.md);
// the plan codec and safetensors' header use the same encoding.

#include <stowage/dcp/metadata.h>

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <string>

namespace stowage::dcp::detail {

// An ObjectPath as the metadata stores it: keys as strings, list indices as numbers.
nlohmann::json encode_path(const ObjectPath& path);

// A non-tensor leaf as the metadata stores it, and back; decoding throws CorruptionError
// for malformed input, of `entry`, with `origin` as its file and `where` in its message.
nlohmann::json encode_value(const c10::IValue& value, const std::string& fqn);
c10::IValue decode_value(const nlohmann::json& value, const std::string& origin, const std::string& where,
                         const std::string& entry);

}  // namespace stowage::dcp::detail
