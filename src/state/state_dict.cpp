#include <stowage/error.h>
#include <stowage/state/state_dict.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

namespace stowage {
namespace {

std::string describe(const ObjectPath& path) {
  return path.empty() ? std::string("<root>") : "'" + path_to_string(path) + "'";
}

// The path element by element, e.g. ["layers", 0, "w"]: unlike the dotted name it tells
// "a.b" from "a" then "b".
std::string describe_elements(const ObjectPath& path) {
  std::vector<std::string> elements;
  for (const PathElement& element : path) {
    if (const auto* key = std::get_if<std::string>(&element)) {
      std::string quoted = "\"";
      for (const char c : *key) {
        if (c == '"' || c == '\\') {
          quoted += '\\';
        }
        quoted += c;
      }
      elements.push_back(quoted + '"');
    } else {
      elements.push_back(std::to_string(std::get<int64_t>(element)));
    }
  }
  return fmt::format("[{}]", fmt::join(elements, ", "));
}

bool is_container(const c10::IValue& value) {
  if (value.isGenericDict()) {
    return value.toGenericDict().size() != 0;
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor() || element.isGenericDict() || element.isList()) {
        return true;
      }
    }
  }
  return false;
}

void check_leaf(const c10::IValue& value, const ObjectPath& path) {
  if (value.isTensor() || value.isInt() || value.isDouble() || value.isBool() || value.isString() || value.isNone() ||
      value.isGenericDict() || value.isList()) {
    return;
  }
  throw InvalidArgument(
      fmt::format("state dict entry {} holds a value of type {}, which a state dict cannot hold "
                  "(supported: tensors, int, double, bool, string, None, lists and string-keyed dicts)",
                  describe(path), value.tagKind()));
}

// Visits every leaf in traversal order.
template <typename Visit>
void walk(const c10::IValue& value, ObjectPath& path, const Visit& visit) {
  if (!is_container(value)) {
    check_leaf(value, path);
    if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) {
        check_leaf(element, path);
      }
    }
    visit(path, value);
    return;
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    for (const auto& item : dict) {
      if (!item.key().isString()) {
        throw InvalidArgument(fmt::format("state dict entry {} has a key of type {}; keys must be strings",
                                          describe(path), item.key().tagKind()));
      }
      path.emplace_back(item.key().toStringRef());
      walk(item.value(), path, visit);
      path.pop_back();
    }
    return;
  }
  int64_t index = 0;
  for (const c10::IValue& element : value.toListRef()) {
    path.emplace_back(index++);
    walk(element, path, visit);
    path.pop_back();
  }
}

template <typename Visit>
void walk_state_dict(const StateDict& state, const Visit& visit) {
  ObjectPath path;
  for (const auto& item : state) {
    path.emplace_back(item.key());
    walk(item.value(), path, visit);
    path.pop_back();
  }
}

c10::IValue copy_structure(const c10::IValue& value) {
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    c10::impl::GenericDict copy(dict.keyType(), dict.valueType());
    for (const auto& item : dict) {
      copy.insert(item.key(), copy_structure(item.value()));
    }
    return copy;
  }
  if (value.isList()) {
    const auto list = value.toList();
    c10::impl::GenericList copy(list.elementType());
    copy.reserve(list.size());
    // By index: the list's iterator yields proxies, which gcc 12 and 14 each warn about.
    for (size_t i = 0; i < list.size(); ++i) {
      copy.push_back(copy_structure(list.get(i)));
    }
    return copy;
  }
  return value;
}

// One node of the tree unflatten builds before converting it to IValues.
struct Node {
  bool is_leaf = false;
  c10::IValue leaf;
  bool is_list = false;  // decided by the first child's path element
  std::vector<std::pair<PathElement, Node>> children;

  Node& child(const PathElement& element, const ObjectPath& path) {
    const bool list_element = std::holds_alternative<int64_t>(element);
    if (children.empty()) {
      is_list = list_element;
    } else if (is_list != list_element) {
      throw InvalidArgument(fmt::format("flat state dict path {} mixes list indices and dict keys", describe(path)));
    }
    for (auto& existing : children) {
      if (existing.first == element) {
        return existing.second;
      }
    }
    children.emplace_back(element, Node{});
    return children.back().second;
  }

  c10::IValue to_ivalue(ObjectPath& path) const {
    if (is_leaf) {
      return leaf;
    }
    if (!is_list) {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [element, node] : children) {
        path.push_back(element);
        dict.insert(std::get<std::string>(element), node.to_ivalue(path));
        path.pop_back();
      }
      return dict;
    }
    std::vector<const Node*> ordered(children.size(), nullptr);
    for (const auto& [element, node] : children) {
      const int64_t index = std::get<int64_t>(element);
      if (index < 0 || index >= static_cast<int64_t>(children.size()) || ordered[index] != nullptr) {
        throw InvalidArgument(fmt::format("flat state dict list at {} has index {} among {} elements", describe(path),
                                          index, children.size()));
      }
      ordered[index] = &node;
    }
    c10::impl::GenericList list(c10::AnyType::get());
    for (size_t i = 0; i < ordered.size(); ++i) {
      path.emplace_back(static_cast<int64_t>(i));
      list.push_back(ordered[i]->to_ivalue(path));
      path.pop_back();
    }
    return list;
  }
};

}  // namespace

StateDict::StateDict()
    : dict_(c10::impl::toTypedDict<std::string, c10::IValue>(
          c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()))) {}

StateDict::StateDict(StateDict&& other) noexcept : StateDict() {
  std::swap(dict_, other.dict_);
}

StateDict& StateDict::operator=(StateDict&& other) noexcept {
  if (this != &other) {
    dict_ = other.dict_;
    other.dict_ = StateDict().dict_;
  }
  return *this;
}

StateDict::StateDict(const c10::impl::GenericDict& dict) : StateDict() {
  if (*dict.keyType() != *c10::StringType::get()) {
    throw InvalidArgument(fmt::format("a state dict needs string keys, not {}", dict.keyType()->str()));
  }
  if (*dict.valueType() == *c10::AnyType::get()) {
    dict_ = c10::impl::toTypedDict<std::string, c10::IValue>(dict);
    return;
  }
  for (const auto& item : dict) {
    dict_.insert(item.key().toStringRef(), item.value());
  }
}

std::string path_to_string(const ObjectPath& path) {
  std::string out;
  for (const PathElement& element : path) {
    if (!out.empty()) {
      out += '.';
    }
    if (const auto* key = std::get_if<std::string>(&element)) {
      out += *key;
    } else {
      out += std::to_string(std::get<int64_t>(element));
    }
  }
  return out;
}

void FlatStateDict::add(FlatEntry entry) {
  const auto [it, inserted] = index_.emplace(entry.fqn, entries_.size());
  if (!inserted) {
    throw InvalidArgument(fmt::format("state dict entries {} and {} both flatten to the name '{}'",
                                      describe_elements(entries_[it->second].path), describe_elements(entry.path),
                                      entry.fqn));
  }
  entries_.push_back(std::move(entry));
}

const FlatEntry* FlatStateDict::find(const std::string& fqn) const {
  const auto it = index_.find(fqn);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const FlatEntry& FlatStateDict::at(const std::string& fqn) const {
  const FlatEntry* entry = find(fqn);
  if (entry == nullptr) {
    throw InvalidArgument(fmt::format("flat state dict has no entry '{}'", fqn));
  }
  return *entry;
}

FlatStateDict flatten_state_dict(const StateDict& state) {
  FlatStateDict flat;
  walk_state_dict(state, [&](const ObjectPath& path, const c10::IValue& value) {
    flat.add(FlatEntry{path_to_string(path), path, value});
  });
  return flat;
}

void validate_state_dict(const StateDict& state) {
  flatten_state_dict(state);
}

StateDict unflatten_state_dict(const FlatStateDict& flat) {
  Node root;
  for (const FlatEntry& entry : flat.entries()) {
    if (entry.path.empty() || !std::holds_alternative<std::string>(entry.path.front())) {
      throw InvalidArgument(fmt::format("flat state dict entry '{}' does not start with a key", entry.fqn));
    }
    Node* node = &root;
    ObjectPath prefix;
    for (const PathElement& element : entry.path) {
      if (node->is_leaf) {
        throw InvalidArgument(
            fmt::format("flat state dict entry {} is both a value and a container", describe(prefix)));
      }
      prefix.push_back(element);
      node = &node->child(element, prefix);
    }
    if (node->is_leaf || !node->children.empty()) {
      throw InvalidArgument(fmt::format("flat state dict path {} is given twice", describe(entry.path)));
    }
    node->is_leaf = true;
    node->leaf = entry.value;
  }
  StateDict state;
  ObjectPath path;
  for (const auto& [element, node] : root.children) {
    path.push_back(element);
    state.insert(std::get<std::string>(element), node.to_ivalue(path));
    path.pop_back();
  }
  return state;
}

void set_leaf(StateDict& root, const ObjectPath& path, const c10::IValue& value) {
  TORCH_INTERNAL_ASSERT(!path.empty(), "set_leaf: an empty path");
  if (path.size() == 1) {
    root.insert_or_assign(std::get<std::string>(path.front()), value);
    return;
  }
  c10::IValue parent = root.at(std::get<std::string>(path.front()));
  for (size_t i = 1; i + 1 < path.size(); ++i) {
    parent = parent.isGenericDict() ? parent.toGenericDict().at(std::get<std::string>(path[i]))
                                    : parent.toList().get(std::get<int64_t>(path[i]));
  }
  if (parent.isGenericDict()) {
    parent.toGenericDict().insert_or_assign(std::get<std::string>(path.back()), value);
  } else {
    parent.toList().set(std::get<int64_t>(path.back()), value);
  }
}

StateDict deep_copy_structure(const StateDict& state) {
  validate_state_dict(state);
  StateDict copy;
  for (const auto& item : state) {
    copy.insert(item.key(), copy_structure(item.value()));
  }
  return copy;
}

}  // namespace stowage
