#pragma once

// A pickle decoder that executes nothing: it rebuilds plain data (None, bools, ints,
// floats, strings, bytes, tuples, lists, dicts) and records, for the few globals a
// caller allows, what a real unpickler would have called: a class instantiated with
// its arguments and its BUILD state, or a callable applied to its arguments. What those
// records mean is up to the caller (torch_dcp_metadata.h, torch_save_archive.h).
//
// Invariants, whatever the input:
//  - every global is resolved against the caller's allow-list; any other one is an
//    error naming it, before anything is built from it;
//  - every length is checked against the bytes left before anything is allocated, and
//    the values built (each value, and each argument a REDUCE or NEWOBJ copies out of
//    a tuple) are counted against a budget, by default one per input byte plus
//    kPickleValueSlack: the values built never take more than a small multiple of the
//    input's size (about 200 bytes per input byte at most);
//  - containers nest at most kMaxPickleDepth deep and never contain themselves (a
//    container is frozen once it is put into another one), so walking a result
//    recursively is safe;
//  - errors are CorruptionError naming the origin, the byte offset and the opcode (or
//    the global).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stowage::dcp::detail {

inline constexpr int kMaxPickleDepth = 64;
// Values built beyond one per input byte by default (UnpicklerOptions::max_values).
inline constexpr int64_t kPickleValueSlack = 1024;

struct PickleValue;
using PickleRef = std::shared_ptr<PickleValue>;

// How a caller allows a global to be used.
enum class GlobalUse {
  kConstant,     // only pushed as a value (torch.float32)
  kCallable,     // REDUCE applies it (torch.Size((4, 6))); the result is a kCall
  kClass,        // NEWOBJ / NEWOBJ_EX instantiate it, BUILD sets its state; a kObject
  kDictFactory,  // REDUCE with no arguments makes an empty dict (collections.OrderedDict)
};

struct AllowedGlobal {
  std::string module;
  std::string name;
  GlobalUse use;
};

struct PickleValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kBigInt,  // an integer beyond 64 bits: its value is not kept
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,        // an allowed global: module, name
    kCall,          // REDUCE of a kCallable global: global, items (its arguments)
    kObject,        // NEWOBJ of a kClass global: global, items (its arguments), state
    kPersistentId,  // BINPERSID: items[0] is the persistent id
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string text;                                      // kString, kBytes
  std::vector<PickleRef> items;                          // kTuple, kList; kCall / kObject arguments
  std::vector<std::pair<PickleRef, PickleRef>> entries;  // kDict, in file order
  const AllowedGlobal* global = nullptr;                 // kGlobal, kCall, kObject
  PickleRef state;                                       // kObject: BUILD's argument, null without one
  int depth = 1;                                         // of the nesting below and including this value
  bool frozen = false;                                   // put into a container: never changed again

  bool is(Kind k) const { return kind == k; }
  // The value of `key` in a kDict whose keys are strings; null when absent.
  const PickleValue* find(std::string_view key) const;
  // "a dict", "torch.Size(...)", ...: for messages.
  std::string describe() const;
};

struct UnpicklerOptions {
  // The only globals the input may name (none when null). PickleValue::global points
  // into this list, so it must outlive the values built: a static list.
  const std::vector<AllowedGlobal>* globals = nullptr;
  // The most values the decoding builds (an argument copied out of a tuple counts as
  // one); negative: the input's size plus kPickleValueSlack.
  int64_t max_values = -1;
  // Whether BINPERSID is accepted (torch.save's data.pkl refers to its storages so).
  bool allow_persistent_ids = false;
  // Names the input in errors (a file, or a record of an archive in a file).
  std::string origin;
  // Added to the pickle's byte offsets in errors: where the pickle starts in the file
  // CorruptionError names.
  int64_t base_offset = 0;
  // The file and the checkpoint entry errors name (CorruptionError::file, ::entry).
  std::string file;
  std::string entry;
};

// Decodes one pickle (protocols 2 to 5), which must end with STOP exactly at the end of
// `bytes`. Throws CorruptionError as described above.
PickleRef unpickle(std::string_view bytes, const UnpicklerOptions& options);

}  // namespace stowage::dcp::detail
