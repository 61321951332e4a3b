#pragma once

// Deprecated: safetensors export and import are in the interop library (link
// stowage::interop) and its header <stowage/interop/safetensors.h>. This header goes in
// the next release.

#include <stowage/interop/safetensors.h>
