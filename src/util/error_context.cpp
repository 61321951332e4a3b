#include "util/error_context.h"

#include <stowage/error.h>

namespace stowage::util {

void rethrow_in_context(const std::string& context, const std::string& entry) {
  try {
    throw;
  } catch (const NotFound& e) {
    throw NotFound(context + e.what(), e.path(), e.operation(), e.error_number());
  } catch (const IoError& e) {
    throw IoError(context + e.what(), e.path(), e.operation(), e.error_number());
  } catch (const CorruptionError& e) {
    throw CorruptionError(context + e.what(), e.entry().empty() ? entry : e.entry(), e.file(), e.offset());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(context + e.what());
  } catch (const Error& e) {
    throw Error(context + e.what());
  }
}

}  // namespace stowage::util
