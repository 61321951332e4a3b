#include "interop/torch_dcp_metadata.h"

#include "dcp/format/checks.h"
#include "interop/restricted_unpickler.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstdlib>
#include <map>
#include <utility>

namespace stowage::dcp::detail {
namespace {

using Kind = PickleValue::Kind;

// A hostile `.metadata` may name one memoized string or torch.Size from many places, so
// that copying them costs far more than their bytes in the input: the converter counts
// what it copies (names, path elements, dimensions at 8 bytes each) and refuses more
// than kCopyFactor times the input's size plus kCopySlack.
constexpr int64_t kCopyFactor = 32;
constexpr int64_t kCopySlack = int64_t(16) << 20;
// Chunks of one entry: checking that they tile it is quadratic in their number.
constexpr size_t kMaxChunksPerEntry = 65536;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
// torch <= 2.3 kept TensorProperties with ShardedTensor's metadata.
constexpr const char* kLegacyPropertiesModule = "torch.distributed._shard.sharded_tensor.metadata";

// torch's pickle names of the dtypes stowage holds (dtype.__reduce__ gives the name).
constexpr std::array<std::pair<const char*, c10::ScalarType>, 13> kTorchDtypes = {{
    {"float32", c10::kFloat},
    {"float64", c10::kDouble},
    {"float16", c10::kHalf},
    {"bfloat16", c10::kBFloat16},
    {"int64", c10::kLong},
    {"int32", c10::kInt},
    {"int16", c10::kShort},
    {"int8", c10::kChar},
    {"uint8", c10::kByte},
    {"bool", c10::kBool},
    {"complex32", c10::kComplexHalf},
    {"complex64", c10::kComplexFloat},
    {"complex128", c10::kComplexDouble},
}};

// The allow-list of `.metadata`: DCP's metadata classes, what their pickles refer to,
// and nothing else (docs/FORMAT.md).
std::vector<AllowedGlobal> metadata_globals() {
  std::vector<AllowedGlobal> globals;
  for (const char* cls : {"Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
                          "TensorProperties", "MetadataIndex", "StorageMeta"}) {
    globals.push_back({kMetadataModule, cls, GlobalUse::kClass});
  }
  globals.push_back({kMetadataModule, "_MEM_FORMAT_ENCODING", GlobalUse::kCallable});
  globals.push_back({kLegacyPropertiesModule, "TensorProperties", GlobalUse::kClass});
  globals.push_back({kLegacyPropertiesModule, "MEM_FORMAT_ENCODING", GlobalUse::kCallable});
  globals.push_back({"torch.distributed.checkpoint.filesystem", "_StorageInfo", GlobalUse::kClass});
  globals.push_back({"torch", "Size", GlobalUse::kCallable});
  globals.push_back({"torch.serialization", "_get_layout", GlobalUse::kCallable});
  // StorageMeta.checkpoint_id: a path, rebuilt from its parts (never used).
  for (const char* module : {"pathlib", "pathlib._local"}) {
    for (const char* cls : {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"}) {
      globals.push_back({module, cls, GlobalUse::kCallable});
    }
  }
  for (const auto& dtype : kTorchDtypes) globals.push_back({"torch", dtype.first, GlobalUse::kConstant});
  return globals;
}

// The checks of one decoding; every failure names the file and where in the metadata.
class Converter {
 public:
  Converter(const std::string& origin, size_t input_bytes)
      : origin_(origin), copy_budget_(kCopyFactor * static_cast<int64_t>(input_bytes) + kCopySlack) {
    empty_dict_.kind = Kind::kDict;
  }

  TorchDcpMetadata convert(const PickleValue& root) {
    const PickleValue& state = object_state(root, "Metadata", "the metadata");
    const PickleValue& entries = field(state, "state_dict_metadata", Kind::kDict, "the metadata");
    read_storage_data(field(state, "storage_data", Kind::kDict, "the metadata"));
    const PickleValue* planner_data = state.find("planner_data");
    if (planner_data != nullptr && !planner_data->is(Kind::kDict) && !planner_data->is(Kind::kNone)) {
      fail("the metadata", "field 'planner_data' must be a dict or None");
    }
    for (const auto& [key, value] : entries.entries) {
      if (!key->is(Kind::kString)) fail("state_dict_metadata", "a key is not a str");
      add_entry(text(*key, "state_dict_metadata"), *value, planner_data);
    }
    if (!storage_.empty()) {
      fail(fmt::format("storage_data of entry '{}'", storage_.begin()->first.first),
           "a storage location belongs to no chunk of the entries");
    }
    if (const PickleValue* meta = state.find("storage_meta"); meta != nullptr && !meta->is(Kind::kNone)) {
      const PickleValue& meta_state = object_state(*meta, "StorageMeta", "storage_meta");
      if (const PickleValue* save_id = meta_state.find("save_id"); save_id && save_id->is(Kind::kString)) {
        out_.metadata.save_id = save_id->text;
      }
    }
    out_.metadata.version = 0;
    out_.metadata.world_size = max_rank_ + 1;
    try {
      out_.metadata.index();
    } catch (const InvalidArgument& e) {
      fail("state_dict_metadata", e.what());
    }
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& what, const std::string& entry = "") const {
    throw CorruptionError(fmt::format("DCP metadata '{}': {}: {}", origin_, where, what), entry, origin_);
  }

  // Counts `bytes` copied for `where` (entry `fqn`) against the budget.
  void count_copy(size_t bytes, const std::string& where, const std::string& fqn = "") {
    if (static_cast<uint64_t>(bytes) > static_cast<uint64_t>(copy_budget_ - copied_)) {
      fail(where,
           fmt::format("copying its names and sizes takes more than {} bytes ({} times the input's size plus {}): "
                       "the metadata shares one value from too many places",
                       copy_budget_, kCopyFactor, kCopySlack),
           fqn);
    }
    copied_ += static_cast<int64_t>(bytes);
  }
  // The text of the kString `value`, counted against the budget.
  std::string text(const PickleValue& value, const std::string& where, const std::string& fqn = "") {
    count_copy(value.text.size(), where, fqn);
    return value.text;
  }

  // The state dict BUILD gave an object of DCP's class `cls` (an empty one without BUILD).
  const PickleValue& object_state(const PickleValue& value, const char* cls, const std::string& where) const {
    const bool known_module = value.is(Kind::kObject) &&
                              (value.global->module == kMetadataModule ||
                               value.global->module == kLegacyPropertiesModule || value.global->name == "_StorageInfo");
    if (!known_module || value.global->name != cls) {
      fail(where, fmt::format("expected a {}, found {}", cls, value.describe()));
    }
    if (!value.state) return empty_dict_;
    if (!value.state->is(Kind::kDict)) fail(where, fmt::format("the {}'s state is {}", cls, value.state->describe()));
    return *value.state;
  }

  const PickleValue& field(const PickleValue& dict, const char* name, Kind kind, const std::string& where) const {
    const PickleValue* value = dict.find(name);
    if (value == nullptr) fail(where, fmt::format("missing field '{}'", name));
    if (!value->is(kind)) fail(where, fmt::format("field '{}' is {}", name, value->describe()));
    return *value;
  }

  int64_t integer(const PickleValue& value, const std::string& where, const char* what) const {
    if (!value.is(Kind::kInt)) fail(where, fmt::format("{} is {}, not an int", what, value.describe()));
    return value.integer;
  }

  // torch.Size((a, b, ...)): its sizes, each non-negative.
  std::vector<int64_t> size(const PickleValue& value, const std::string& where, const char* what) {
    if (!value.is(Kind::kCall) || value.global->name != "Size" || value.items.size() != 1 ||
        !value.items[0]->is(Kind::kTuple)) {
      fail(where, fmt::format("{} is {}, not a torch.Size", what, value.describe()));
    }
    count_copy(value.items[0]->items.size() * sizeof(int64_t), where);
    std::vector<int64_t> sizes;
    for (const PickleRef& element : value.items[0]->items) {
      const int64_t n = integer(*element, where, what);
      if (n < 0) fail(where, fmt::format("{} holds the negative size {}", what, n));
      sizes.push_back(n);
    }
    return sizes;
  }

  c10::ScalarType dtype(const PickleValue& properties, const std::string& where) const {
    const PickleValue& props = *properties.state;  // checked by the caller
    const PickleValue* dtype = nullptr;
    if (props.is(Kind::kTuple) && !props.items.empty()) dtype = props.items[0].get();  // __getstate__'s 5-tuple
    if (props.is(Kind::kDict)) dtype = props.find("dtype");
    if (dtype == nullptr || !dtype->is(Kind::kGlobal)) fail(where, "TensorProperties without a dtype");
    c10::ScalarType out;
    if (dtype->global->module != "torch" || !torch_dtype_from_name(dtype->global->name, &out)) {
      fail(where, fmt::format("unsupported dtype torch.{}", dtype->global->name));
    }
    return out;
  }

  // storage_data: MetadataIndex(fqn, offset) -> _StorageInfo, matched to chunks on
  // (fqn, offset) only (MetadataIndex.index is a lookup hint).
  void read_storage_data(const PickleValue& storage_data) {
    for (const auto& [key, value] : storage_data.entries) {
      const PickleValue& index = object_state(*key, "MetadataIndex", "storage_data");
      const std::string fqn = text(field(index, "fqn", Kind::kString, "storage_data"), "storage_data");
      const std::string where = fmt::format("storage_data of entry '{}'", fqn);
      std::vector<int64_t> offset;
      const PickleValue* offset_value = index.find("offset");
      const bool has_offset = offset_value != nullptr && !offset_value->is(Kind::kNone);
      if (has_offset) offset = size(*offset_value, where, "MetadataIndex.offset");
      const PickleValue& info = object_state(*value, "_StorageInfo", where);
      StorageLocation location;
      location.file = text(field(info, "relative_path", Kind::kString, where), where, fqn);
      location.offset = integer(field(info, "offset", Kind::kInt, where), where, "offset");
      location.length = integer(field(info, "length", Kind::kInt, where), where, "length");
      if (!is_safe_file_name(location.file)) {
        fail(where, fmt::format("file name '{}' would leave the checkpoint directory", location.file), fqn);
      }
      if (location.offset < 0 || location.length < 0) fail(where, "a negative offset or length", fqn);
      if (const PickleValue* transforms = info.find("transform_descriptors");
          transforms != nullptr && !transforms->is(Kind::kNone) &&
          !((transforms->is(Kind::kList) || transforms->is(Kind::kTuple)) && transforms->items.empty())) {
        fail(where, "its bytes are transformed (transform_descriptors, e.g. zstd), which this reader cannot undo", fqn);
      }
      if (!storage_.emplace(std::make_pair(fqn, std::make_pair(has_offset, offset)), location).second) {
        fail(where, "two storage locations for one chunk", fqn);
      }
    }
  }

  StorageLocation take_location(const std::string& fqn, bool has_offset, const std::vector<int64_t>& offset,
                                const std::string& where) {
    const auto it = storage_.find(std::make_pair(fqn, std::make_pair(has_offset, offset)));
    if (it == storage_.end()) fail(where, "no storage location (storage_data) for it", fqn);
    StorageLocation location = std::move(it->second);
    storage_.erase(it);
    return location;
  }

  ObjectPath path_of(const std::string& fqn, const PickleValue* planner_data) {
    const std::string where = fmt::format("planner_data of entry '{}'", fqn);
    const PickleValue* saved = planner_data && planner_data->is(Kind::kDict) ? planner_data->find(fqn) : nullptr;
    ObjectPath path;
    if (saved == nullptr) {  // no planner data: the name's dot-separated keys
      count_copy(fqn.size(), where, fqn);
      for (size_t begin = 0;;) {
        const size_t dot = fqn.find('.', begin);
        path.emplace_back(fqn.substr(begin, dot - begin));
        if (dot == std::string::npos) break;
        begin = dot + 1;
      }
      return path;
    }
    if (!saved->is(Kind::kTuple) || saved->items.empty()) fail(where, "the path must be a non-empty tuple", fqn);
    for (const PickleRef& element : saved->items) {
      if (element->is(Kind::kString)) {
        path.emplace_back(text(*element, where, fqn));
      } else if (element->is(Kind::kInt) && element->integer >= 0) {
        path.emplace_back(element->integer);
      } else {
        fail(where, "the path may hold only str keys and list indices", fqn);
      }
    }
    if (!std::holds_alternative<std::string>(path.front())) fail(where, "the path must start with a key", fqn);
    if (path_to_string(path) != fqn) fail(where, "the path does not join to the entry's name", fqn);
    return path;
  }

  void add_entry(const std::string& fqn, const PickleValue& value, const PickleValue* planner_data) {
    const std::string where = fmt::format("entry '{}'", fqn);
    EntryMetadata entry;
    entry.fqn = fqn;
    entry.path = path_of(fqn, planner_data);
    if (value.is(Kind::kObject) && value.global->name == "BytesStorageMetadata") {
      object_state(value, "BytesStorageMetadata", where);
      entry.kind = EntryKind::kValue;
      out_.values.push_back(TorchDcpValueItem{out_.metadata.entries.size(), take_location(fqn, false, {}, where)});
      out_.metadata.entries.push_back(std::move(entry));
      return;
    }
    const PickleValue& tensor = object_state(value, "TensorStorageMetadata", where);
    const PickleValue& properties = field(tensor, "properties", Kind::kObject, where);
    if (properties.global->name != "TensorProperties" || !properties.state) {
      fail(where, fmt::format("properties is {}, not a TensorProperties", properties.describe()), fqn);
    }
    entry.kind = EntryKind::kTensor;
    entry.dtype = dtype(properties, where);
    entry.shape = size(field(tensor, "size", Kind::kCall, where), where, "size");
    if (const CheckedCount bytes = count_bytes(entry.shape, entry.dtype, where); !bytes.ok()) {
      throw CorruptionError(fmt::format("DCP metadata '{}': {}", origin_, bytes.problem), fqn, origin_);
    }
    const std::vector<PickleRef>& chunks = field(tensor, "chunks", Kind::kList, where).items;
    if (chunks.size() > kMaxChunksPerEntry) {
      fail(where, fmt::format("{} chunks, more than the {} this reader accepts", chunks.size(), kMaxChunksPerEntry),
           fqn);
    }
    std::vector<ChunkBox> boxes;
    for (const PickleRef& chunk_value : chunks) {
      count_copy(fqn.size(), where, fqn);  // the storage key take_location builds
      const PickleValue& chunk = object_state(*chunk_value, "ChunkStorageMetadata", where);
      TensorChunk out;
      out.box.offsets = size(field(chunk, "offsets", Kind::kCall, where), where, "chunk offsets");
      out.box.sizes = size(field(chunk, "sizes", Kind::kCall, where), where, "chunk sizes");
      out.location = take_location(fqn, true, out.box.offsets, where);
      out.rank = rank_of(out.location.file);
      boxes.push_back(out.box);
      entry.chunks.push_back(std::move(out));
    }
    if (const std::string problem = tiling_problem(entry.shape, boxes, where); !problem.empty()) {
      throw CorruptionError(fmt::format("DCP metadata '{}': {}", origin_, problem), fqn, origin_);
    }
    out_.metadata.entries.push_back(std::move(entry));
  }

  // The rank in "__<rank>_<k>.distcp", FileSystemWriter's names; 0 for other names.
  int64_t rank_of(const std::string& file) {
    if (file.rfind("__", 0) != 0) return 0;
    char* end = nullptr;
    const long long rank = std::strtoll(file.c_str() + 2, &end, 10);
    if (end == file.c_str() + 2 || *end != '_' || rank < 0 || rank > (int64_t(1) << 31)) return 0;
    max_rank_ = std::max<int64_t>(max_rank_, rank);
    return rank;
  }

  const std::string& origin_;
  TorchDcpMetadata out_;
  // (fqn, (has offset, offset)) -> location; each taken by its chunk or value.
  std::map<std::pair<std::string, std::pair<bool, std::vector<int64_t>>>, StorageLocation> storage_;
  int64_t max_rank_ = 0;
  int64_t copy_budget_;
  int64_t copied_ = 0;
  PickleValue empty_dict_;  // the state of an object without BUILD
};

}  // namespace

bool torch_dtype_from_name(const std::string& name, c10::ScalarType* dtype) {
  for (const auto& [torch_name, scalar_type] : kTorchDtypes) {
    if (name == torch_name) {
      *dtype = scalar_type;
      return true;
    }
  }
  return false;
}

TorchDcpMetadata decode_torch_dcp_metadata(std::string_view bytes, const std::string& origin) {
  static const std::vector<AllowedGlobal> globals = metadata_globals();
  UnpicklerOptions options;
  options.globals = &globals;
  options.origin = fmt::format("DCP metadata '{}'", origin);
  options.file = origin;
  const PickleRef root = unpickle(bytes, options);
  return Converter(origin, bytes.size()).convert(*root);
}

}  // namespace stowage::dcp::detail
