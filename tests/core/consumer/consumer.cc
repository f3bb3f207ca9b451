// Links against an installed libfuselet through find_package(fuselet) and runs RMSNorm.
#include <cmath>
#include <cstdio>

#include "fuselet/norm.h"

int main() {
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 1}, y[4], rstd[1];
  fuselet_tensor tx{x, FUSELET_FLOAT32, 2, {1, 4}, {4, 1}}, tw{w, FUSELET_FLOAT32, 1, {4}, {1}},
      ty{y, FUSELET_FLOAT32, 2, {1, 4}, {4, 1}}, tr{rstd, FUSELET_FLOAT32, 1, {1}, {1}};
  if (fuselet_rms_norm_fwd(&tx, &tw, 1e-6f, 0, &ty, &tr) != FUSELET_OK) {
    std::printf("consumer: %s\n", fuselet_last_error());
    return 1;
  }
  const float expect = 4.f / std::sqrt(7.5f + 1e-6f);
  std::printf("consumer: libfuselet %s, y[3] = %.6f (expected %.6f)\n", fuselet_version(), y[3], expect);
  return std::fabs(y[3] - expect) < 1e-5f ? 0 : 1;
}
