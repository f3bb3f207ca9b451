// The tolerance the CUDA norm tests compare with (tolerance.h), checked where no GPU is needed:
// it must reject the errors the earlier, relative-and-growing tolerance let through, and accept
// what two correct float32 computations rounded to the output dtype can differ by.
#include <cmath>
#include <string>

#include "expect.h"
#include "tolerance.h"

namespace {

using fuselet_test::expect;
using fuselet_test::Tolerance;

// `steps` units in the last place of `dt` above `ref` (> 0).
double ulps_above(fuselet_dtype dt, double ref, double steps) {
  int e;
  std::frexp(ref, &e);  // ref in [2^(e-1), 2^e)
  return ref + steps * fuselet_test::dtype_eps(dt) * std::ldexp(1.0, e - 1);
}

}  // namespace

int main() {
  // dweight in bfloat16, summed over 1000 rows of terms of size ~1: a sum of size ~sqrt(1000).
  const Tolerance rows1000{1000, 40.0};
  const double dw = 31.5;
  expect(rows1000.accepts(FUSELET_BFLOAT16, ulps_above(FUSELET_BFLOAT16, dw, 1), dw),
         "bf16 dweight 1 ulp off accepted");
  expect(rows1000.accepts(FUSELET_BFLOAT16, ulps_above(FUSELET_BFLOAT16, dw, 2), dw),
         "bf16 dweight 2 ulps off accepted");
  expect(!rows1000.accepts(FUSELET_BFLOAT16, ulps_above(FUSELET_BFLOAT16, dw, 3), dw),
         "bf16 dweight 3 ulps off rejected");
  expect(!rows1000.accepts(FUSELET_BFLOAT16, 1.95 * dw, dw), "bf16 dweight 95% off rejected");
  expect(!rows1000.accepts(FUSELET_BFLOAT16, -dw, dw), "bf16 dweight of the wrong sign rejected");
  // y in float16 of a row of 4096: the reduction's part is far below one float16 ulp.
  const Tolerance row4096{4096, 4.0};
  for (double y : {1.0, 0.3, 3.7}) {
    expect(row4096.accepts(FUSELET_FLOAT16, ulps_above(FUSELET_FLOAT16, y, 1), y), "fp16 y 1 ulp off accepted");
    expect(!row4096.accepts(FUSELET_FLOAT16, ulps_above(FUSELET_FLOAT16, y, 3), y), "fp16 y 3 ulps off rejected");
    expect(!row4096.accepts(FUSELET_FLOAT16, ulps_above(FUSELET_FLOAT16, y, 10), y), "fp16 y 10 ulps off rejected");
  }
  // float32: the absolute part grows with the reduction, and only it.
  const double y = 1.5, off = 1.2e-5;  // ~100 float32 ulps
  expect(!Tolerance{16, 4.0}.accepts(FUSELET_FLOAT32, y + off, y), "f32 y 100 ulps off over 16 terms rejected");
  expect(Tolerance{30000, 4.0}.accepts(FUSELET_FLOAT32, y + off, y), "f32 y 100 ulps off over 30000 terms accepted");
  expect(Tolerance{30000, 4.0}.allowed(FUSELET_BFLOAT16, 0.0) == Tolerance{30000, 4.0}.allowed(FUSELET_FLOAT32, 0.0),
         "the absolute part does not depend on the dtype");
  // Scale-free: 1e30 inputs give rstd ~ 1e-30, compared with a tolerance of that size.
  const double rstd = 3.3e-31;
  expect(Tolerance{4097, rstd}.accepts(FUSELET_FLOAT32, ulps_above(FUSELET_FLOAT32, rstd, 2), rstd),
         "rstd of 1e30 inputs 2 ulps off accepted");
  expect(!Tolerance{4097, rstd}.accepts(FUSELET_FLOAT32, rstd * 1.001, rstd), "rstd of 1e30 inputs 0.1% off rejected");
  return fuselet_test::report();
}
