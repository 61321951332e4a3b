// Plans and write results between the ranks of one job, as JSON text.
#include "dcp/format/plan_codec.h"
#include "dcp/format/json_values.h"

#include <stowage/error.h>

#include <fmt/format.h>

namespace stowage::dcp::detail {
namespace {

using nlohmann::json;

constexpr const char* kOrigin = "from another rank";

ObjectPath decode_path(const json& in) {
  ObjectPath path;
  for (const json& element : in) {
    if (element.is_string()) {
      path.emplace_back(element.get<std::string>());
    } else {
      path.emplace_back(element.get<int64_t>());
    }
  }
  return path;
}

json encode_box(const ChunkBox& box) {
  return json{{"offsets", box.offsets}, {"sizes", box.sizes}};
}

ChunkBox decode_box(const json& in) {
  return ChunkBox{in.at("offsets").get<std::vector<int64_t>>(), in.at("sizes").get<std::vector<int64_t>>()};
}

// Parses `bytes`, turning nlohmann's errors into ours.
template <typename Decode>
auto decode(const std::string& bytes, const char* what, Decode&& body) {
  try {
    return body(json::parse(bytes));
  } catch (const json::exception& e) {
    throw Error(fmt::format("malformed {} {}: {}", what, kOrigin, e.what()));
  }
}

json encode_items(const std::vector<WriteItem>& in) {
  json items = json::array();
  for (const WriteItem& item : in) {
    json out{{"fqn", item.fqn},
             {"path", encode_path(item.path)},
             {"tensor", item.kind == EntryKind::kTensor},
             {"data_index", item.data_index}};
    if (item.kind == EntryKind::kTensor) {
      out["dtype"] = static_cast<int>(item.dtype);
      out["global_shape"] = item.global_shape;
      out["box"] = encode_box(item.box);
      out["nbytes"] = item.nbytes;
    } else {
      out["value"] = encode_value(item.value, item.fqn);
    }
    items.push_back(std::move(out));
  }
  return items;
}

std::vector<WriteItem> decode_items(const json& in) {
  std::vector<WriteItem> items;
  for (const json& item_in : in) {
    WriteItem item;
    item.fqn = item_in.at("fqn").get<std::string>();
    item.path = decode_path(item_in.at("path"));
    item.data_index = item_in.at("data_index").get<size_t>();
    if (item_in.at("tensor").get<bool>()) {
      item.kind = EntryKind::kTensor;
      item.dtype = static_cast<c10::ScalarType>(item_in.at("dtype").get<int>());
      item.global_shape = item_in.at("global_shape").get<std::vector<int64_t>>();
      item.box = decode_box(item_in.at("box"));
      item.nbytes = item_in.at("nbytes").get<int64_t>();
    } else {
      item.kind = EntryKind::kValue;
      item.value = decode_value(item_in.at("value"), kOrigin, fmt::format("entry '{}'", item.fqn), item.fqn);
    }
    items.push_back(std::move(item));
  }
  return items;
}

json encode_plan(const SavePlan& plan) {
  return json{{"rank", plan.rank}, {"file_prefix", plan.file_prefix}, {"items", encode_items(plan.items)}};
}

SavePlan decode_plan(const json& in) {
  SavePlan plan;
  plan.rank = in.at("rank").get<int64_t>();
  plan.file_prefix = in.at("file_prefix").get<std::string>();
  plan.items = decode_items(in.at("items"));
  return plan;
}

json encode_results(const std::vector<WriteResult>& results) {
  json out = json::array();
  for (const WriteResult& result : results) {
    out.push_back(json{{"fqn", result.fqn},
                       {"box", encode_box(result.box)},
                       {"rank", result.rank},
                       {"file", result.location.file},
                       {"offset", result.location.offset},
                       {"length", result.location.length},
                       {"checksum", result.location.checksum},
                       {"block_checksums", result.location.block_checksums}});
  }
  return out;
}

std::vector<WriteResult> decode_results(const json& in) {
  std::vector<WriteResult> results;
  for (const json& item : in) {
    WriteResult result;
    result.fqn = item.at("fqn").get<std::string>();
    result.box = decode_box(item.at("box"));
    result.rank = item.at("rank").get<int64_t>();
    result.location.file = item.at("file").get<std::string>();
    result.location.offset = item.at("offset").get<int64_t>();
    result.location.length = item.at("length").get<int64_t>();
    result.location.checksum = item.at("checksum").get<uint64_t>();
    result.location.block_checksums = item.at("block_checksums").get<std::vector<uint64_t>>();
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace

std::string encode_save_plan(const SavePlan& plan) {
  return encode_plan(plan).dump();
}

SavePlan decode_save_plan(const std::string& bytes) {
  return decode(bytes, "save plan", [](const json& in) { return decode_plan(in); });
}

std::string encode_assignment(const SavePlan& plan, const std::vector<WriteItem>& replicas) {
  return json{{"plan", encode_plan(plan)}, {"replicas", encode_items(replicas)}}.dump();
}

RankAssignment decode_assignment(const std::string& bytes) {
  return decode(bytes, "save plan", [](const json& in) {
    return RankAssignment{decode_plan(in.at("plan")), decode_items(in.at("replicas"))};
  });
}

std::string encode_writes(const std::vector<WriteResult>& results, const std::vector<ReplicaHash>& replica_hashes) {
  json hashes = json::array();
  for (const ReplicaHash& copy : replica_hashes) {
    hashes.push_back(json{{"fqn", copy.fqn}, {"offsets", copy.offsets}, {"rank", copy.rank}, {"hash", copy.hash}});
  }
  return json{{"results", encode_results(results)}, {"replica_hashes", std::move(hashes)}}.dump();
}

RankWrites decode_writes(const std::string& bytes) {
  return decode(bytes, "write results", [](const json& in) {
    RankWrites writes{decode_results(in.at("results")), {}};
    for (const json& copy : in.at("replica_hashes")) {
      writes.replica_hashes.push_back(ReplicaHash{copy.at("fqn").get<std::string>(),
                                                  copy.at("offsets").get<std::vector<int64_t>>(),
                                                  copy.at("rank").get<int64_t>(), copy.at("hash").get<uint64_t>()});
    }
    return writes;
  });
}

}  // namespace stowage::dcp::detail
