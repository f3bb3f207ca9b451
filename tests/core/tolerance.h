// How far one float32 computation of a norm may be from another (the CUDA kernels from the CPU
// ones): each side rounds its float32 result to the output dtype once, so 2 units in the last
// place of that dtype at the value; and the two sum their reductions in different
// orders, so an absolute part that grows with the reduction: 4 float32 epsilons x sqrt(terms
// reduced) x the size of the sums. Only the absolute part grows with the reduction length.
#pragma once

#include <cmath>
#include <cstdint>

#include "fuselet/fuselet.h"

namespace fuselet_test {

// The spacing of the dtype's values in [1, 2): one unit in the last place, relative.
inline double dtype_eps(fuselet_dtype dt) {
  return dt == FUSELET_FLOAT32 ? 0x1p-23 : dt == FUSELET_FLOAT16 ? 0x1p-10 : 0x1p-7;
}

struct Tolerance {
  int64_t reduced;  // terms summed into each value (hidden size for a row, rows for dweight)
  double scale;     // the size of the sums (a norm's output: 1; dweight over R rows: sqrt(R))

  double allowed(fuselet_dtype dt, double ref) const {
    const double n = static_cast<double>(reduced > 1 ? reduced : 1);
    const double ulp = ref == 0 ? 0.0 : std::ldexp(dtype_eps(dt), std::ilogb(ref));  // at |ref|
    return 2.0 * ulp + 4.0 * 0x1p-23 * std::sqrt(n) * scale;
  }
  bool accepts(fuselet_dtype dt, double got, double ref) const { return std::fabs(got - ref) <= allowed(dt, ref); }
};

}  // namespace fuselet_test
