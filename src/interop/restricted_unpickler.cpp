#include "interop/restricted_unpickler.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

namespace stowage::dcp::detail {
namespace {

using Kind = PickleValue::Kind;

// Opcodes this decoder does not implement, by name, so that an error says which one
// it met (pickletools' names).
const char* unsupported_opcode_name(uint8_t opcode) {
  switch (opcode) {
    case 'P':
      return "PERSID";
    case 'Q':
      return "BINPERSID";
    case 'i':
      return "INST";
    case 'o':
      return "OBJ";
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 'I':
      return "INT";
    case 'L':
      return "LONG";
    case 'F':
      return "FLOAT";
    case 'S':
      return "STRING";
    case 'T':
      return "BINSTRING";
    case 'U':
      return "SHORT_BINSTRING";
    case 'V':
      return "UNICODE";
    case 'p':
      return "PUT";
    case 'g':
      return "GET";
    case 0x8f:
      return "EMPTY_SET";
    case 0x90:
      return "ADDITEMS";
    case 0x91:
      return "FROZENSET";
    case 0x96:
      return "BYTEARRAY8";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return "an unknown opcode";
  }
}

// One decoding. Invariants: `at_` never passes the input's end; every value on the
// stack, in the memo or inside a container is complete except the containers on the
// stack that are not frozen.
class Unpickler {
 public:
  Unpickler(std::string_view bytes, const UnpicklerOptions& options)
      : in_(bytes),
        options_(options),
        max_values_(options.max_values >= 0 ? options.max_values
                                            : static_cast<int64_t>(bytes.size()) + kPickleValueSlack) {}

  PickleRef run() {
    while (true) {
      opcode_at_ = at_;
      opcode_ = take_byte();
      if (opcode_ == '.') break;  // STOP
      step();
    }
    if (at_ != in_.size()) fail(fmt::format("{} bytes follow STOP", in_.size() - at_));
    if (stack_.size() != 1 || !marks_.empty()) fail("STOP leaves no single value on the stack");
    return stack_.back();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CorruptionError(fmt::format("{}: pickle offset {}: opcode 0x{:02x}: {}", options_.origin, opcode_at_,
                                      static_cast<unsigned>(opcode_), what),
                          options_.entry, options_.file, options_.base_offset + static_cast<int64_t>(opcode_at_));
  }

  // ---- reading the input, every length checked against what is left
  size_t left() const { return in_.size() - at_; }
  std::string_view take(uint64_t length) {
    if (length > left()) fail(fmt::format("a length of {} bytes runs past the end ({} left)", length, left()));
    const std::string_view out = in_.substr(at_, static_cast<size_t>(length));
    at_ += static_cast<size_t>(length);
    return out;
  }
  uint8_t take_byte() { return static_cast<uint8_t>(take(1)[0]); }
  uint64_t take_le(int bytes) {
    const std::string_view raw = take(static_cast<uint64_t>(bytes));
    uint64_t value = 0;
    for (int i = bytes; i-- > 0;) value = (value << 8) | static_cast<uint8_t>(raw[static_cast<size_t>(i)]);
    return value;
  }
  std::string take_line() {
    const size_t end = in_.find('\n', at_);
    if (end == std::string_view::npos) fail("a text argument has no end of line");
    std::string line(in_.substr(at_, end - at_));
    at_ = end + 1;
    return line;
  }

  // ---- the budget of values built
  void count_values(size_t count) {
    if (static_cast<uint64_t>(count) > static_cast<uint64_t>(max_values_ - values_)) {
      fail(fmt::format("it builds more than {} values (the budget for {} input bytes)", max_values_, in_.size()));
    }
    values_ += static_cast<int64_t>(count);
  }
  PickleRef new_value(Kind kind) {
    count_values(1);
    auto value = std::make_shared<PickleValue>();
    value->kind = kind;
    return value;
  }

  // ---- the stack
  void push(PickleRef value) { stack_.push_back(std::move(value)); }
  PickleRef pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("the stack is empty");
    PickleRef value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }
  PickleRef& top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("the stack is empty");
    return stack_.back();
  }
  // The values above the last MARK, which is removed.
  std::vector<PickleRef> pop_to_mark() {
    if (marks_.empty()) fail("no MARK");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleRef> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(mark)),
                                 std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  // Puts `child` into the unfrozen container `parent`: the child is frozen from now on,
  // which rules out cycles (a container never gains a place in itself later).
  void adopt(PickleValue& parent, PickleValue& child) {
    if (parent.frozen) fail(fmt::format("{} is changed after being put into another container", parent.describe()));
    if (&parent == &child) fail(fmt::format("{} is put into itself", parent.describe()));
    child.frozen = true;
    if (child.depth + 1 > kMaxPickleDepth) fail(fmt::format("values nest deeper than {} levels", kMaxPickleDepth));
    parent.depth = std::max(parent.depth, child.depth + 1);
  }
  PickleRef container(Kind kind, std::vector<PickleRef> items) {
    PickleRef value = new_value(kind);
    for (PickleRef& item : items) adopt(*value, *item);
    value->items = std::move(items);
    return value;
  }
  void append(PickleValue& list, std::vector<PickleRef> items) {
    if (!list.is(Kind::kList)) fail(fmt::format("APPEND to {}", list.describe()));
    for (PickleRef& item : items) {
      adopt(list, *item);
      list.items.push_back(std::move(item));
    }
  }
  void set_items(PickleValue& dict, std::vector<PickleRef> items) {
    if (!dict.is(Kind::kDict)) fail(fmt::format("SETITEM on {}", dict.describe()));
    if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
    for (size_t i = 0; i < items.size(); i += 2) {
      adopt(dict, *items[i]);
      adopt(dict, *items[i + 1]);
      dict.entries.emplace_back(std::move(items[i]), std::move(items[i + 1]));
    }
  }

  // ---- memo
  void memo_put(uint64_t index) { memo_[index] = top(); }
  void memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail(fmt::format("memo entry {} was never stored", index));
    push(it->second);
  }

  // ---- values
  void push_int(int64_t value) {
    PickleRef v = new_value(Kind::kInt);
    v->integer = value;
    push(std::move(v));
  }
  void push_long(uint64_t length) {
    const std::string_view raw = take(length);
    if (raw.size() > 8) {  // python ints of any size; only 64-bit ones are kept
      push(new_value(Kind::kBigInt));
      return;
    }
    uint64_t value = 0;
    for (size_t i = raw.size(); i-- > 0;) value = (value << 8) | static_cast<uint8_t>(raw[i]);
    if (!raw.empty() && raw.size() < 8 && (static_cast<uint8_t>(raw.back()) & 0x80)) {
      value |= ~uint64_t(0) << (8 * raw.size());  // sign-extend
    }
    push_int(static_cast<int64_t>(value));
  }
  void push_text(Kind kind, uint64_t length) {
    PickleRef v = new_value(kind);
    v->text = std::string(take(length));
    push(std::move(v));
  }
  void push_bool(bool value) {
    PickleRef v = new_value(Kind::kBool);
    v->boolean = value;
    push(std::move(v));
  }

  void push_global(const std::string& module, const std::string& name) {
    if (options_.globals == nullptr) fail(fmt::format("global '{}.{}' is not allowed", module, name));
    for (const AllowedGlobal& allowed : *options_.globals) {
      if (allowed.module == module && allowed.name == name) {
        PickleRef v = new_value(Kind::kGlobal);
        v->global = &allowed;
        push(std::move(v));
        return;
      }
    }
    fail(fmt::format("global '{}.{}' is not allowed", module, name));
  }
  void stack_global() {
    const PickleRef name = pop();
    const PickleRef module = pop();
    if (!module->is(Kind::kString) || !name->is(Kind::kString)) fail("STACK_GLOBAL of a non-string");
    push_global(module->text, name->text);
  }

  const AllowedGlobal& global_of(const PickleValue& value, const char* what) {
    if (!value.is(Kind::kGlobal)) fail(fmt::format("{} of {}, not of a global", what, value.describe()));
    return *value.global;
  }
  void reduce() {
    PickleRef args = pop();
    const PickleRef callable = pop();
    const AllowedGlobal& global = global_of(*callable, "REDUCE");
    if (!args->is(Kind::kTuple)) fail("REDUCE with arguments that are not a tuple");
    if (global.use == GlobalUse::kDictFactory && args->items.empty()) {
      push(new_value(Kind::kDict));
      return;
    }
    if (global.use != GlobalUse::kCallable) {
      fail(fmt::format("REDUCE of '{}.{}', which may not be called so", global.module, global.name));
    }
    push(call(Kind::kCall, callable, arguments(*args)));
  }
  void new_object(bool with_kwargs) {
    if (with_kwargs) {
      const PickleRef kwargs = pop();
      if (!kwargs->is(Kind::kDict) || !kwargs->entries.empty()) fail("NEWOBJ_EX with keyword arguments");
    }
    PickleRef args = pop();
    const PickleRef cls = pop();
    const AllowedGlobal& global = global_of(*cls, "NEWOBJ");
    if (global.use != GlobalUse::kClass) {
      fail(fmt::format("NEWOBJ of '{}.{}', which may not be instantiated so", global.module, global.name));
    }
    if (!args->is(Kind::kTuple)) fail("NEWOBJ with arguments that are not a tuple");
    push(call(Kind::kObject, cls, arguments(*args)));
  }
  // The items of an argument tuple, copied: the tuple may be memoized or inside another
  // container, and stays as it is. Each copy counts against the budget.
  std::vector<PickleRef> arguments(const PickleValue& args) {
    count_values(args.items.size());
    return args.items;
  }
  PickleRef call(Kind kind, const PickleRef& global, std::vector<PickleRef> args) {
    PickleRef v = container(kind, std::move(args));
    v->global = global->global;
    return v;
  }
  void build() {
    PickleRef state = pop();
    PickleValue& object = *top();
    if (!object.is(Kind::kObject) || object.state) fail(fmt::format("BUILD on {}", object.describe()));
    adopt(object, *state);
    object.state = std::move(state);
  }
  void persistent_id() {
    if (!options_.allow_persistent_ids) fail("BINPERSID (persistent ids are not allowed here)");
    PickleRef id = pop();
    push(container(Kind::kPersistentId, {std::move(id)}));
  }

  // The protocol, frames, marks and the stack's own operations; false for another opcode.
  bool framing_or_stack_op() {
    switch (opcode_) {
      case 0x80: {  // PROTO
        const uint8_t protocol = take_byte();
        if (protocol < 2 || protocol > 5) fail(fmt::format("unsupported pickle protocol {}", protocol));
        return true;
      }
      case 0x95:
        take(8);
        return true;  // FRAME: its length only helps buffering
      case '(':
        marks_.push_back(stack_.size());
        return true;
      case '0':
        pop();
        return true;  // POP
      case '1':
        pop_to_mark();
        return true;  // POP_MARK
      case '2':
        push(top());
        return true;  // DUP
      default:
        return false;
    }
  }

  // Lists, tuples and dicts, empty or from the stack; false for another opcode.
  bool container_op() {
    switch (opcode_) {
      case '}':
        push(new_value(Kind::kDict));
        return true;
      case ']':
        push(new_value(Kind::kList));
        return true;
      case ')':
        push(new_value(Kind::kTuple));
        return true;
      case 'l':
        push(container(Kind::kList, pop_to_mark()));
        return true;  // LIST
      case 't':
        push(container(Kind::kTuple, pop_to_mark()));
        return true;  // TUPLE
      case 'd': {     // DICT
        PickleRef dict = new_value(Kind::kDict);
        set_items(*dict, pop_to_mark());
        push(std::move(dict));
        return true;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1-3
        std::vector<PickleRef> items(static_cast<size_t>(opcode_ - 0x84));
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(container(Kind::kTuple, std::move(items)));
        return true;
      }
      case 'a': {  // APPEND
        PickleRef item = pop();
        append(*top(), {std::move(item)});
        return true;
      }
      case 'e': {  // APPENDS
        std::vector<PickleRef> items = pop_to_mark();
        append(*top(), std::move(items));
        return true;
      }
      case 's': {  // SETITEM
        PickleRef value = pop();
        PickleRef key = pop();
        set_items(*top(), {std::move(key), std::move(value)});
        return true;
      }
      case 'u': {  // SETITEMS
        std::vector<PickleRef> items = pop_to_mark();
        set_items(*top(), std::move(items));
        return true;
      }
      default:
        return false;
    }
  }

  // Strings, bytes, integers, None, booleans and floats; false for another opcode.
  bool scalar_op() {
    switch (opcode_) {
      case 0x8c:
        push_text(Kind::kString, take_le(1));
        return true;  // SHORT_BINUNICODE
      case 'X':
        push_text(Kind::kString, take_le(4));
        return true;  // BINUNICODE
      case 0x8d:
        push_text(Kind::kString, take_le(8));
        return true;  // BINUNICODE8
      case 'C':
        push_text(Kind::kBytes, take_le(1));
        return true;  // SHORT_BINBYTES
      case 'B':
        push_text(Kind::kBytes, take_le(4));
        return true;  // BINBYTES
      case 0x8e:
        push_text(Kind::kBytes, take_le(8));
        return true;  // BINBYTES8
      case 'K':
        push_int(static_cast<int64_t>(take_le(1)));
        return true;  // BININT1
      case 'M':
        push_int(static_cast<int64_t>(take_le(2)));
        return true;  // BININT2
      case 'J':
        push_int(static_cast<int32_t>(static_cast<uint32_t>(take_le(4))));
        return true;  // BININT
      case 0x8a:
        push_long(take_le(1));
        return true;  // LONG1
      case 0x8b:
        push_long(take_le(4));
        return true;  // LONG4
      case 'N':
        push(new_value(Kind::kNone));
        return true;
      case 0x88:
        push_bool(true);
        return true;
      case 0x89:
        push_bool(false);
        return true;
      case 'G': {  // BINFLOAT: big-endian IEEE 754 double
        const std::string_view raw = take(8);
        uint64_t bits = 0;
        for (char c : raw) bits = (bits << 8) | static_cast<uint8_t>(c);
        PickleRef v = new_value(Kind::kFloat);
        std::memcpy(&v->floating, &bits, sizeof bits);
        push(std::move(v));
        return true;
      }
      default:
        return false;
    }
  }

  // Globals, calls, objects, persistent ids and the memo; false for another opcode.
  bool object_or_memo_op() {
    switch (opcode_) {
      case 'c': {  // GLOBAL: "module\nname\n"
        const std::string module = take_line();
        const std::string name = take_line();
        push_global(module, name);
        return true;
      }
      case 0x93:
        stack_global();
        return true;
      case 'R':
        reduce();
        return true;
      case 0x81:
        new_object(false);
        return true;  // NEWOBJ
      case 0x92:
        new_object(true);
        return true;  // NEWOBJ_EX
      case 'b':
        build();
        return true;
      case 'Q':
        persistent_id();
        return true;
      case 0x94:
        memo_put(memo_.size());
        return true;  // MEMOIZE
      case 'q':
        memo_put(take_le(1));
        return true;  // BINPUT
      case 'r':
        memo_put(take_le(4));
        return true;  // LONG_BINPUT
      case 'h':
        memo_get(take_le(1));
        return true;  // BINGET
      case 'j':
        memo_get(take_le(4));
        return true;  // LONG_BINGET
      default:
        return false;
    }
  }

  // Runs the opcode just read.
  void step() {
    if (framing_or_stack_op() || container_op() || scalar_op() || object_or_memo_op()) return;
    fail(fmt::format("unsupported opcode {}", unsupported_opcode_name(opcode_)));
  }

  std::string_view in_;
  const UnpicklerOptions& options_;
  int64_t max_values_;
  int64_t values_ = 0;
  size_t at_ = 0;
  size_t opcode_at_ = 0;
  uint8_t opcode_ = 0;
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;  // stack sizes at each MARK
  std::unordered_map<uint64_t, PickleRef> memo_;
};

}  // namespace

const PickleValue* PickleValue::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k->is(Kind::kString) && k->text == key) return v.get();
  }
  return nullptr;
}

std::string PickleValue::describe() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kBigInt:
      return "an int beyond 64 bits";
    case Kind::kFloat:
      return "a float";
    case Kind::kString:
      return "a str";
    case Kind::kBytes:
      return "a bytes";
    case Kind::kTuple:
      return "a tuple";
    case Kind::kList:
      return "a list";
    case Kind::kDict:
      return "a dict";
    case Kind::kGlobal:
      return fmt::format("the global '{}.{}'", global->module, global->name);
    case Kind::kCall:
      return fmt::format("a call of '{}.{}'", global->module, global->name);
    case Kind::kObject:
      return fmt::format("a '{}.{}' object", global->module, global->name);
    case Kind::kPersistentId:
      return "a persistent id";
  }
  return "a value";
}

PickleRef unpickle(std::string_view bytes, const UnpicklerOptions& options) {
  return Unpickler(bytes, options).run();
}

}  // namespace stowage::dcp::detail
