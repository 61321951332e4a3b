#include "interop/torch_save_archive.h"

#include "interop/restricted_unpickler.h"

#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <limits>

namespace stowage::dcp::detail {
namespace {

using Kind = PickleValue::Kind;

// A data.pkl larger than this is refused before it is read: a tensor's is about 150
// bytes, a value's as large as the value.
constexpr int64_t kMaxPickleBytes = int64_t(64) << 20;

// Zip record signatures and fixed sizes (APPNOTE.TXT).
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64EndLocator = 0x07064b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr int64_t kEndBytes = 22, kZip64LocatorBytes = 20, kZip64EndBytes = 56, kCentralBytes = 46, kLocalBytes = 30;
constexpr uint32_t kZip64Marker = 0xffffffff;

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}

uint64_t little_endian(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width; i-- > 0;) value = (value << 8) | static_cast<uint8_t>(bytes[at + static_cast<size_t>(i)]);
  return value;
}

// data.pkl of a tensor: torch._utils._rebuild_tensor_v2 over a persistent storage.
std::vector<AllowedGlobal> tensor_globals() {
  std::vector<AllowedGlobal> globals = {{"torch._utils", "_rebuild_tensor_v2", GlobalUse::kCallable},
                                        {"collections", "OrderedDict", GlobalUse::kDictFactory}};
  for (const char* storage :
       {"FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "LongStorage", "IntStorage", "ShortStorage",
        "CharStorage", "ByteStorage", "BoolStorage", "ComplexFloatStorage", "ComplexDoubleStorage"}) {
    globals.push_back({"torch", storage, GlobalUse::kConstant});
  }
  return globals;
}

// The dtype of torch.<Name>Storage: LibTorch's name of the dtype is <Name>.
bool storage_dtype(const std::string& storage_class, c10::ScalarType* dtype) {
  const std::string suffix = "Storage";
  if (storage_class.size() <= suffix.size()) return false;
  const std::string name = storage_class.substr(0, storage_class.size() - suffix.size());
  for (c10::ScalarType candidate :
       {c10::kFloat, c10::kDouble, c10::kHalf, c10::kBFloat16, c10::kLong, c10::kInt, c10::kShort, c10::kChar,
        c10::kByte, c10::kBool, c10::kComplexFloat, c10::kComplexDouble}) {
    if (name == c10::toString(candidate)) {
      *dtype = candidate;
      return true;
    }
  }
  return false;
}

// What _rebuild_tensor_v2(storage, storage_offset, size, stride, ...) describes.
struct TensorLayout {
  std::string storage_key;  // its record is data/<key>
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t storage_numel = 0;
  int64_t storage_offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

}  // namespace

uint32_t crc32(const void* data, size_t length, uint32_t crc) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* bytes = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < length; ++i) crc = table[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

TorchSaveArchive::TorchSaveArchive(const ReadableFile& file, int64_t offset, int64_t length, std::string entry,
                                   std::string context)
    : file_(file), offset_(offset), length_(length), entry_(std::move(entry)), context_(std::move(context)) {
  read_directory();
}

void TorchSaveArchive::fail(const std::string& what, int64_t file_offset) const {
  throw CorruptionError(
      fmt::format("{}: entry '{}': data file '{}': the torch.save archive at offset {} ({} bytes): {}", context_,
                  entry_, file_.path(), offset_, length_, what),
      entry_, file_.path(), file_offset);
}

std::string TorchSaveArchive::read_at(int64_t offset, int64_t length) const {
  if (offset < 0 || length < 0 || offset > length_ || length > length_ - offset) {
    fail(fmt::format("bytes {} to {} lie outside it", offset, offset + length), offset_ + std::max<int64_t>(offset, 0));
  }
  std::string bytes(static_cast<size_t>(length), '\0');
  file_.read_at(bytes.data(), length, offset_ + offset);
  return bytes;
}

// The end-of-central-directory record must end the range (torch writes no comment); a
// zip64 locator before it, which torch always writes, says where the zip64 record is.
void TorchSaveArchive::read_directory() {
  if (length_ < kEndBytes) fail("too short for a zip archive", offset_);
  const int64_t end_at = length_ - kEndBytes;
  const std::string end = read_at(end_at, kEndBytes);
  if (little_endian(end, 0, 4) != kEndOfCentralDirectory || little_endian(end, 20, 2) != 0) {
    fail("no end-of-central-directory record at its end", offset_ + end_at);
  }
  uint64_t count = little_endian(end, 10, 2);
  uint64_t directory_size = little_endian(end, 12, 4);
  uint64_t directory_at = little_endian(end, 16, 4);
  if (end_at >= kZip64LocatorBytes) {
    const std::string locator = read_at(end_at - kZip64LocatorBytes, kZip64LocatorBytes);
    if (little_endian(locator, 0, 4) == kZip64EndLocator) {
      const uint64_t zip64_at = little_endian(locator, 8, 8);
      if (zip64_at > static_cast<uint64_t>(end_at)) fail("its zip64 locator points outside it", offset_ + end_at);
      const std::string zip64 = read_at(static_cast<int64_t>(zip64_at), kZip64EndBytes);
      if (little_endian(zip64, 0, 4) != kZip64End) fail("no zip64 end record", offset_ + int64_t(zip64_at));
      count = little_endian(zip64, 32, 8);
      directory_size = little_endian(zip64, 40, 8);
      directory_at = little_endian(zip64, 48, 8);
    }
  }
  if (directory_at > static_cast<uint64_t>(end_at) || directory_size > static_cast<uint64_t>(end_at) - directory_at ||
      count > directory_size / kCentralBytes) {
    fail(fmt::format("its central directory ({} records, {} bytes at {}) does not fit", count, directory_size,
                     directory_at),
         offset_ + end_at);
  }
  const std::string directory = read_at(static_cast<int64_t>(directory_at), static_cast<int64_t>(directory_size));
  size_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const int64_t header_at = offset_ + static_cast<int64_t>(directory_at + at);
    if (directory.size() - at < kCentralBytes || little_endian(directory, at, 4) != kCentralHeader) {
      fail("a malformed central directory record", header_at);
    }
    const uint16_t method = static_cast<uint16_t>(little_endian(directory, at + 10, 2));
    const uint32_t crc = static_cast<uint32_t>(little_endian(directory, at + 16, 4));
    uint64_t compressed = little_endian(directory, at + 20, 4);
    uint64_t size = little_endian(directory, at + 24, 4);
    const size_t name_length = little_endian(directory, at + 28, 2);
    const size_t extra_length = little_endian(directory, at + 30, 2);
    const size_t comment_length = little_endian(directory, at + 32, 2);
    uint64_t local = little_endian(directory, at + 42, 4);
    if (directory.size() - at - kCentralBytes < name_length + extra_length + comment_length) {
      fail("a central directory record runs past the directory", header_at);
    }
    const std::string name = directory.substr(at + kCentralBytes, name_length);
    // The zip64 extra field holds, in this order, each 32-bit field set to 0xffffffff.
    for (size_t e = at + kCentralBytes + name_length, extra_end = e + extra_length; e + 4 <= extra_end;) {
      const uint64_t id = little_endian(directory, e, 2);
      const size_t data_length = little_endian(directory, e + 2, 2);
      if (data_length > extra_end - e - 4) fail("a malformed extra field", header_at);
      if (id == 0x0001) {
        size_t field = e + 4;
        for (uint64_t* value : {&size, &compressed, &local}) {
          if (*value != kZip64Marker) continue;
          if (field + 8 > e + 4 + data_length) fail("a short zip64 extra field", header_at);
          *value = little_endian(directory, field, 8);
          field += 8;
        }
      }
      e += 4 + data_length;
    }
    if (compressed != size) fail(fmt::format("record '{}' is compressed", name), header_at);
    if (size > static_cast<uint64_t>(length_) || local > static_cast<uint64_t>(length_)) {
      fail(fmt::format("record '{}' does not fit", name), header_at);
    }
    add_record(name, method, crc, static_cast<int64_t>(size), static_cast<int64_t>(local));
    at += kCentralBytes + name_length + extra_length + comment_length;
  }
}

// Records sit under the prefix of the first one ("archive/" for torch.save's default
// name); the local header says where the bytes start.
void TorchSaveArchive::add_record(const std::string& name, uint16_t method, uint32_t crc, int64_t size,
                                  int64_t local_header) {
  if (records_.empty() && prefix_.empty()) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos) fail(fmt::format("record '{}' has no prefix", name), offset_ + local_header);
    prefix_ = name.substr(0, slash + 1);
  }
  if (name.compare(0, prefix_.size(), prefix_) != 0) {
    fail(fmt::format("record '{}' is not under '{}'", name, prefix_), offset_ + local_header);
  }
  if (method != 0) fail(fmt::format("record '{}' is compressed (method {})", name, method), offset_ + local_header);
  const std::string local = read_at(local_header, kLocalBytes);
  if (little_endian(local, 0, 4) != kLocalHeader) {
    fail(fmt::format("record '{}' has no local header", name), offset_ + local_header);
  }
  const int64_t data_at = local_header + kLocalBytes + static_cast<int64_t>(little_endian(local, 26, 2)) +
                          static_cast<int64_t>(little_endian(local, 28, 2));
  if (data_at > length_ || size > length_ - data_at) {
    fail(fmt::format("record '{}' runs past the archive's end", name), offset_ + local_header);
  }
  if (!records_.emplace(name.substr(prefix_.size()), Record{offset_ + data_at, size, crc}).second) {
    fail(fmt::format("record '{}' appears twice", name), offset_ + local_header);
  }
}

const TorchSaveArchive::Record& TorchSaveArchive::record(const std::string& name) const {
  const auto it = records_.find(name);
  if (it == records_.end()) fail(fmt::format("it has no record '{}{}'", prefix_, name), offset_);
  return it->second;
}

void TorchSaveArchive::read_record(const std::string& name, const Record& record, void* out) const {
  file_.read_at(out, record.size, record.data_offset);
  const uint32_t actual = crc32(out, static_cast<size_t>(record.size));
  if (actual != record.crc) {
    fail(fmt::format("record '{}{}' ({} bytes at offset {}) is corrupt: CRC32 {:08x}, expected {:08x}", prefix_, name,
                     record.size, record.data_offset, actual, record.crc),
         record.data_offset);
  }
}

std::string TorchSaveArchive::read_pickle() const {
  // torch.save writes "little" on little-endian machines (and nothing before torch 1.13):
  // the records' bytes are read as they are, so any other byte order is refused.
  if (const auto it = records_.find("byteorder"); it != records_.end()) {
    const Record& byteorder = it->second;
    std::string order(static_cast<size_t>(std::min<int64_t>(byteorder.size, 16)), '\0');
    if (byteorder.size <= 16) read_record("byteorder", byteorder, order.data());
    if (byteorder.size > 16 || order != "little") {
      fail(fmt::format("record '{}byteorder' says '{}', not 'little'", prefix_,
                       byteorder.size > 16 ? "(" + std::to_string(byteorder.size) + " bytes)" : order),
           byteorder.data_offset);
    }
  }
  const Record& pickle = record("data.pkl");
  if (pickle.size > kMaxPickleBytes) {
    fail(fmt::format("its data.pkl has {} bytes, more than the {} this reader accepts", pickle.size, kMaxPickleBytes),
         pickle.data_offset);
  }
  std::string bytes(static_cast<size_t>(pickle.size), '\0');
  read_record("data.pkl", pickle, bytes.data());
  return bytes;
}

namespace {

// A value of stowage's value model (docs/FORMAT.md), or an Error naming the entry.
class ValueConverter {
 public:
  explicit ValueConverter(std::string where) : where_(std::move(where)) {}

  c10::IValue value(const PickleValue& v) const {
    if (v.is(Kind::kList) || v.is(Kind::kTuple)) return list(v);
    if (v.is(Kind::kDict) && v.entries.empty()) {
      return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
    }
    return scalar(v);
  }

 private:
  [[noreturn]] void unsupported(const PickleValue& v) const {
    throw Error(
        fmt::format("{}: holds {}, which stowage's values cannot represent (docs/FORMAT.md)", where_, v.describe()));
  }

  c10::IValue scalar(const PickleValue& v) const {
    switch (v.kind) {
      case Kind::kNone:
        return c10::IValue();
      case Kind::kBool:
        return v.boolean;
      case Kind::kInt:
        return v.integer;
      case Kind::kFloat:
        return v.floating;
      case Kind::kString:
        return v.text;
      default:
        unsupported(v);
    }
  }

  // A list of one scalar type where all elements share it, else of any.
  c10::IValue list(const PickleValue& v) const {
    std::vector<c10::IValue> elements;
    for (const PickleRef& item : v.items) elements.push_back(scalar(*item));
    c10::TypePtr type = c10::AnyType::get();
    if (!elements.empty()) {
      const c10::TypePtr first = elements.front().type();
      const bool uniform =
          std::all_of(elements.begin(), elements.end(), [&](const c10::IValue& e) { return *e.type() == *first; });
      const bool representable = elements.front().isInt() || elements.front().isDouble() || elements.front().isBool() ||
                                 elements.front().isString();
      if (uniform && representable) type = first;
    }
    c10::impl::GenericList out(type);
    for (c10::IValue& element : elements) out.push_back(std::move(element));
    return out;
  }

  std::string where_;
};

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks[, metadata])
// with storage = BINPERSID ('storage', torch.<X>Storage, key, location, numel).
bool tensor_layout(const PickleValue& v, TensorLayout* out) {
  if (!v.is(Kind::kCall) || v.global->name != "_rebuild_tensor_v2" || v.items.size() < 6 || v.items.size() > 7) {
    return false;
  }
  const PickleValue& storage = *v.items[0];
  if (!storage.is(Kind::kPersistentId) || !storage.items[0]->is(Kind::kTuple)) return false;
  const std::vector<PickleRef>& id = storage.items[0]->items;
  if (id.size() != 5 || !id[0]->is(Kind::kString) || id[0]->text != "storage" || !id[1]->is(Kind::kGlobal) ||
      !storage_dtype(id[1]->global->name, &out->dtype) || !id[2]->is(Kind::kString) || !id[4]->is(Kind::kInt)) {
    return false;
  }
  out->storage_key = id[2]->text;
  out->storage_numel = id[4]->integer;
  if (!v.items[1]->is(Kind::kInt) || !v.items[2]->is(Kind::kTuple) || !v.items[3]->is(Kind::kTuple)) return false;
  out->storage_offset = v.items[1]->integer;
  for (const PickleRef& size : v.items[2]->items) {
    if (!size->is(Kind::kInt)) return false;
    out->sizes.push_back(size->integer);
  }
  for (const PickleRef& stride : v.items[3]->items) {
    if (!stride->is(Kind::kInt)) return false;
    out->strides.push_back(stride->integer);
  }
  return true;
}

// Why the layout does not fit its storage of `element_bytes` elements, or "" when the
// storage holds every element it reaches: [offset, offset + sum((size-1) * stride)]
// inside [0, numel), and every stride and the offset count in bytes without overflow.
// Every dimension is checked, even when an earlier one is empty.
std::string layout_misfit(const TensorLayout& layout, int64_t element_bytes) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (layout.sizes.size() != layout.strides.size()) {
    return fmt::format("{} sizes but {} strides", layout.sizes.size(), layout.strides.size());
  }
  if (layout.storage_numel < 0) return fmt::format("a negative storage size {}", layout.storage_numel);
  if (layout.storage_offset < 0 || layout.storage_offset > kMax / element_bytes) {
    return fmt::format("storage offset {} is negative or overflows", layout.storage_offset);
  }
  bool empty = false;
  for (size_t d = 0; d < layout.sizes.size(); ++d) {
    if (layout.sizes[d] < 0) return fmt::format("size {} of dimension {} is negative", layout.sizes[d], d);
    if (layout.strides[d] < 0 || layout.strides[d] > kMax / element_bytes) {
      return fmt::format("stride {} of dimension {} is negative or overflows", layout.strides[d], d);
    }
    empty = empty || layout.sizes[d] == 0;
  }
  if (empty) {  // no elements: only the offset must lie in the storage
    if (layout.storage_offset > layout.storage_numel) {
      return fmt::format("storage offset {} lies past its {} elements", layout.storage_offset, layout.storage_numel);
    }
    return "";
  }
  int64_t last = layout.storage_offset;
  for (size_t d = 0; d < layout.sizes.size(); ++d) {
    if (layout.strides[d] != 0 && layout.sizes[d] - 1 > (kMax - last) / layout.strides[d]) {
      return fmt::format("the elements of dimension {} reach beyond any storage", d);
    }
    last += (layout.sizes[d] - 1) * layout.strides[d];
  }
  if (last >= layout.storage_numel) {
    return fmt::format("element {} lies past its {} elements", last, layout.storage_numel);
  }
  return "";
}

}  // namespace

PickleRef TorchSaveArchive::unpickle_data(const std::vector<AllowedGlobal>* globals, bool allow_persistent_ids) const {
  UnpicklerOptions options;
  options.globals = globals;
  options.allow_persistent_ids = allow_persistent_ids;
  options.origin =
      fmt::format("{}: entry '{}': data file '{}': record '{}data.pkl'", context_, entry_, file_.path(), prefix_);
  options.base_offset = record("data.pkl").data_offset;
  options.file = file_.path();
  options.entry = entry_;
  return unpickle(read_pickle(), options);
}

c10::IValue TorchSaveArchive::read_value() const {
  const PickleRef value = unpickle_data(nullptr, false);  // no globals: plain Python values need none
  return ValueConverter(fmt::format("{}: entry '{}'", context_, entry_)).value(*value);
}

void TorchSaveArchive::read_tensor(c10::ScalarType dtype, const std::vector<int64_t>& shape, const ChunkBox& region,
                                   const at::Tensor& out) const {
  static const std::vector<AllowedGlobal> globals = tensor_globals();
  const PickleRef root = unpickle_data(&globals, true);
  TensorLayout layout;
  if (!tensor_layout(*root, &layout)) fail(fmt::format("data.pkl holds {}, not a tensor", root->describe()), offset_);
  if (layout.dtype != dtype || layout.sizes != shape) {
    fail(fmt::format("it holds a {} tensor of shape [{}], the metadata says {} [{}]", c10::toString(layout.dtype),
                     fmt::join(layout.sizes, ", "), c10::toString(dtype), fmt::join(shape, ", ")),
         record("data.pkl").data_offset);
  }
  const int64_t element_bytes = element_size(dtype);
  const Record& storage = record("data/" + layout.storage_key);
  std::string misfit = layout_misfit(layout, element_bytes);
  if (misfit.empty() &&
      (layout.storage_numel > storage.size / element_bytes || layout.storage_numel * element_bytes != storage.size)) {
    misfit = fmt::format("its {} elements are not the record's bytes", layout.storage_numel);
  }
  if (!misfit.empty()) {
    fail(fmt::format("its tensor's layout (offset {}, strides [{}]) does not fit its storage of {} bytes: {}",
                     layout.storage_offset, fmt::join(layout.strides, ", "), storage.size, misfit),
         storage.data_offset);
  }
  at::Tensor bytes = at::empty({storage.size}, at::kByte);
  // Read (and checked) even when no element is wanted: a corrupt item never passes.
  read_record("data/" + layout.storage_key, storage, bytes.data_ptr());
  // Copied as bytes (each element a row of element_bytes), so that every dtype, bool
  // included, arrives bit for bit.
  std::vector<int64_t> sizes = layout.sizes, strides = layout.strides;
  for (int64_t& stride : strides) stride *= element_bytes;
  sizes.push_back(element_bytes);
  strides.push_back(1);
  at::Tensor source = bytes.as_strided(sizes, strides, layout.storage_offset * element_bytes);
  std::vector<int64_t> region_bytes = region.sizes;
  region_bytes.push_back(element_bytes);
  for (size_t d = 0; d < region.sizes.size(); ++d) {
    source = source.narrow(static_cast<int64_t>(d), region.offsets[d], region.sizes[d]);
  }
  if (out.nbytes() == 0) return;
  at::from_blob(out.data_ptr(), region_bytes, at::kByte).copy_(source);
}

}  // namespace stowage::dcp::detail
