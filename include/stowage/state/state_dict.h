#pragma once

// The state-dict model shared by every stowage module: a nested, string-keyed,
// insertion-ordered dictionary of c10::IValue, like Python's state_dict().
//
// Leaves are tensors, int, double, bool, string, None, and lists without tensors or
// dicts in them (e.g. a list of ints). Dicts, and lists holding tensors or dicts,
// are containers that flattening walks into. Anything else (tuples, objects,
// futures, dicts with non-string keys) is rejected with an error naming its path.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace stowage {

// A string-keyed, insertion-ordered dictionary of IValues: a default-constructible
// face on c10::Dict<std::string, IValue>. Like every c10::Dict it has reference
// semantics: copying a StateDict shares its entries, as assigning a Python dict does.
// Use deep_copy_structure() for an independent tree. Nested dicts are stored as
// c10 generic dicts; StateDict(value.toGenericDict()) views one as a StateDict.
class StateDict {
 public:
  using Dict = c10::Dict<std::string, c10::IValue>;
  using iterator = Dict::iterator;

  StateDict();
  StateDict(Dict dict) : dict_(std::move(dict)) {}  // NOLINT: shares, like copying
  StateDict(const StateDict&) = default;
  StateDict& operator=(const StateDict&) = default;
  // c10::Dict has no move: its "move" copies the shared handle. A moved-from StateDict
  // is empty instead, so that moving one really hands its entries over (e.g. to
  // another thread) and leaves no reference behind. noexcept, so that containers move
  // StateDicts rather than copy them (the empty dict's allocation failing terminates).
  StateDict(StateDict&& other) noexcept;
  StateDict& operator=(StateDict&& other) noexcept;
  ~StateDict() = default;
  // Shares a dict of string keys and Any values; copies one with narrower value
  // types (e.g. Dict<string, Tensor>) into a new dict. Other keys: InvalidArgument.
  StateDict(const c10::impl::GenericDict& dict);  // NOLINT: implicit by design

  template <typename Value>
  void insert(const std::string& key, Value&& value) {
    dict_.insert(key, c10::IValue(std::forward<Value>(value)));
  }
  template <typename Value>
  void insert_or_assign(const std::string& key, Value&& value) {
    dict_.insert_or_assign(key, c10::IValue(std::forward<Value>(value)));
  }
  // Throws std::out_of_range when absent.
  c10::IValue at(const std::string& key) const { return dict_.at(key); }
  bool contains(const std::string& key) const { return dict_.contains(key); }
  bool erase(const std::string& key) { return dict_.erase(key) != 0; }
  void clear() { dict_.clear(); }
  size_t size() const { return dict_.size(); }
  bool empty() const { return dict_.empty(); }
  iterator begin() const { return dict_.begin(); }
  iterator end() const { return dict_.end(); }

  const Dict& dict() const { return dict_; }
  // As a value, to nest it inside another state dict.
  operator c10::IValue() const { return c10::IValue(dict_); }  // NOLINT

 private:
  Dict dict_;
};

// One step from a container to its child: a dict key or a list index.
using PathElement = std::variant<std::string, int64_t>;
using ObjectPath = std::vector<PathElement>;

// "a.b.0.c" for {"a", "b", 0, "c"}; keys are joined verbatim, as PyTorch's DCP does.
std::string path_to_string(const ObjectPath& path);

struct FlatEntry {
  std::string fqn;    // fully-qualified name: the path joined with '.'
  ObjectPath path;    // the exact path, which keeps keys that contain dots unambiguous
  c10::IValue value;  // a leaf (never a dict, nor a list holding tensors or dicts)
};

// A flattened state dict: its leaves in traversal order, addressable by name.
class FlatStateDict {
 public:
  // Throws InvalidArgument if an entry with the same fqn is already present.
  void add(FlatEntry entry);

  const std::vector<FlatEntry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  bool contains(const std::string& fqn) const { return index_.count(fqn) != 0; }
  // nullptr when absent.
  const FlatEntry* find(const std::string& fqn) const;
  // Throws InvalidArgument naming the fqn when absent.
  const FlatEntry& at(const std::string& fqn) const;

 private:
  std::vector<FlatEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// Flattens nested dicts and tensor lists into dotted names (DCP's flatten_state_dict).
// Throws InvalidArgument naming the path of an unsupported value, or of two entries
// whose names collide (e.g. {"a.b": x} beside {"a": {"b": y}}).
FlatStateDict flatten_state_dict(const StateDict& state);

// Rebuilds the nested structure from the entries' paths. Throws InvalidArgument if
// the paths contradict each other (a key used both as a leaf and as a container, a
// list with missing indices).
StateDict unflatten_state_dict(const FlatStateDict& flat);

// Validates a state dict without copying it (the same checks as flatten_state_dict).
void validate_state_dict(const StateDict& state);

// Replaces the leaf at `path` inside `root`. Containers are shared (StateDict has
// reference semantics), so this edits every state dict that shares them.
// REQUIRES: every container on `path` exists (as flatten_state_dict gave the path).
void set_leaf(StateDict& root, const ObjectPath& path, const c10::IValue& value);

// A new tree of dicts and lists whose leaves are the same objects (tensors are shared,
// not cloned): changing the copy's structure never changes the original's.
StateDict deep_copy_structure(const StateDict& state);

}  // namespace stowage
