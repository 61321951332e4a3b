#pragma once

// A c10::Allocator subclass that compiles against LibTorch 1.13 and 2.x alike. The
// interface changed between them: 2.x made allocate() non-const and added the pure
// virtual copy_data(). Which release did which is detected from the declarations
// themselves, not from version numbers: a subclass of PortableAllocator implements
// allocate_bytes() and gets whichever allocate() and copy_data() its LibTorch declares.

#include <c10/core/Allocator.h>

#include <cstddef>
#include <type_traits>

namespace stowage::memory {
namespace portable_allocator_detail {

template <typename Allocator, typename = void>
struct DeclaresCopyData : std::false_type {};
template <typename Allocator>
struct DeclaresCopyData<Allocator, std::void_t<decltype(&Allocator::copy_data)>> : std::true_type {};

inline constexpr bool kConstAllocate =
    std::is_same_v<decltype(&c10::Allocator::allocate), c10::DataPtr (c10::Allocator::*)(size_t) const>;

// Partial specialisations (on Base) so that only the selected one is ever instantiated.
template <bool kDeclared, typename Base>
class WithCopyData : public Base {};
template <typename Base>
class WithCopyData<true, Base> : public Base {
 public:
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    this->default_copy_data(dest, src, count);
  }
};

template <bool kConst, typename Base>
class WithAllocate : public Base {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return allocate_bytes(nbytes); }
  virtual c10::DataPtr allocate_bytes(size_t nbytes) const = 0;
};
template <typename Base>
class WithAllocate<true, Base> : public Base {
 public:
  c10::DataPtr allocate(size_t nbytes) const override { return allocate_bytes(nbytes); }
  virtual c10::DataPtr allocate_bytes(size_t nbytes) const = 0;
};

}  // namespace portable_allocator_detail

using PortableAllocator = portable_allocator_detail::WithAllocate<
    portable_allocator_detail::kConstAllocate,
    portable_allocator_detail::WithCopyData<portable_allocator_detail::DeclaresCopyData<c10::Allocator>::value,
                                            c10::Allocator>>;

}  // namespace stowage::memory
