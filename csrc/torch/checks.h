// The torch layer's own checks of the ops' arguments: a tensor given for a required argument,
// every tensor on the device of the op's first one. Every other rule is the core's: each op
// calls its `_check` (fuselet/<op>.h) on views of its tensors as given, before any of them is
// made contiguous (a stride-0 or strided view of billions of elements is refused before it is
// copied), and check_args raises the refusal with the core's message. The fake impls of
// python/fuselet/torch/*.py check the same for meta tensors and torch.compile.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "view.h"

namespace fuselet_torch {

// A required tensor argument: None reaches the op as an undefined tensor.
inline void check_defined(const Tensor& t, const char* name) {
  FUSELET_CHECK_TYPE(t.defined(), name, ": expected a tensor, got None");
}

// Every tensor on the device of the reference argument `ref` (named `ref_name`).
inline void check_same_device(const Tensor& ref, const Tensor& t, const char* name, const char* ref_name = "x") {
  check_defined(t, name);
  FUSELET_CHECK_VALUE(same_device(t, ref), name, ": expected a tensor on ", device_name(ref), " (the device of ",
                      ref_name, "), got ", device_name(t));
}

// `ref` (named `ref_name`) given, and every tensor of `others` (name, tensor) on its device.
inline void check_devices(const Tensor& ref, const char* ref_name,
                          std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  check_defined(ref, ref_name);
  for (const auto& [name, t] : others) check_same_device(ref, *t, name, ref_name);
}

// Raises the refusal of a core `_check` function with the core's message: a TypeError for a
// dtype ("<argument>: expected dtype ...", fuselet.h), a ValueError for any other argument.
inline void check_args(fuselet_status status) {
  if (status != FUSELET_ERR_INVALID_ARGUMENT) return check(status);
  const std::string msg = fuselet_last_error();
  FUSELET_CHECK_TYPE(msg.find(": expected dtype ") == std::string::npos, msg);
  fail(Error::Value, msg);
}

}  // namespace fuselet_torch
