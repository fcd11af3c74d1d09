/* pyree_build/math_inline.h: branch-free, loop-free math for generated and hand-written kernels.
 *
 * One math library for what pyree_build generates (the C of `pyree-build replace`, its CUDA and
 * HIP forms) and for user plugins: `#include "pyree_build/math_inline.h"` with the include
 * root `pyree-build --include-dir` prints (the same -I that finds
 * iree/hal/local/executable_plugin.h). Everything is `static inline` (`__device__` under CUDA
 * and HIP, or whatever PYREE_MATH_FN is defined to before the include), needs no libm and no
 * libc, and is written with selects and bit operations only: a loop calling these functions
 * vectorizes with clang -O2 at baseline x86-64 (SSE2) and aarch64. The one loop is
 * pyree_powi's fixed 64 steps (folded away when the exponent is a constant).
 *
 * Each function has a float form (suffix f) computed in float only, and a double form. The
 * generator calls the form of the element type. The generator copies the functions a kernel
 * calls into its file (so the file stays self-contained, NVRTC included): each one starts
 * with a line `PYREE_MATH_FN` and ends with a line `}`, and calls others only by their names.
 *
 * Accuracy, in ulp of the result: the bound tests/models/test_math_inline.py proves (float forms:
 * every float32 exponent, a stride of 4099 over all 2^32 bit patterns, subnormals, +-0, +-inf,
 * NaN, against float64 references 2^29 times finer and mpmath; double forms: 16,000 drawn
 * values over the whole range against mpmath), then the largest error seen, at x86-64's
 * round-to-nearest without FMA (aarch64 and CUDA contract the polynomials into FMAs, which
 * only makes them rounder):
 *
 *   function    float: bound (seen)   double: bound   notes
 *   exp         1.25 (1.14)           1
 *   exp2        1.25 (1.07)           1
 *   expm1       1.5  (1.38)           2
 *   log         1    (0.76)           1
 *   log1p       1.5  (1.44)           2
 *   tanh        2    (1.56)           3
 *   erf         2.5  (2.26)           2
 *   sigmoid     2.5  (2.21)           2.5               1 / (1 + e^-x)
 *   sqrt        0.5                   0.5               the instruction
 *   rsqrt       1.5  (1.49)           1.5               1 / sqrt
 *   pow         1.5 + 2.5 |y log2 m|  2 + |y ln x|      m: x's mantissa in [sqrt(1/2), sqrt(2));
 *                                                       float: <= 2 where |y log2 x| <= 1
 *   powi        repeated squaring, one rounding per step (as LLVM's powi)
 *   floor, ceil, trunc, round, roundeven, fabs, copysign, min/max forms: exact
 *
 * Special values follow C99 Annex F (NaN in, NaN out; pow(x, 0) = pow(1, y) = 1; log(0) =
 * -inf; log(x < 0) = NaN; odd functions keep the sign of zero).
 */
#ifndef PYREE_BUILD_MATH_INLINE_H_
#define PYREE_BUILD_MATH_INLINE_H_

#if !defined(__CUDACC_RTC__)
#include <stdint.h>
#endif

#ifndef PYREE_MATH_FN
#if defined(__CUDACC__) || defined(__HIPCC__)
#define PYREE_MATH_FN __device__ static inline
#else
#define PYREE_MATH_FN static inline
#endif
#endif

/* ---- bits ------------------------------------------------------------------------------ */

PYREE_MATH_FN uint32_t pyree_bitsf(float x) {
  union { float f; uint32_t u; } v;
  v.f = x;
  return v.u;
}

PYREE_MATH_FN float pyree_from_bitsf(uint32_t u) {
  union { float f; uint32_t u; } v;
  v.u = u;
  return v.f;
}

PYREE_MATH_FN uint64_t pyree_bits(double x) {
  union { double f; uint64_t u; } v;
  v.f = x;
  return v.u;
}

PYREE_MATH_FN double pyree_from_bits(uint64_t u) {
  union { double f; uint64_t u; } v;
  v.u = u;
  return v.f;
}

PYREE_MATH_FN float pyree_fabsf(float x) {
  return pyree_from_bitsf(pyree_bitsf(x) & 0x7fffffffu);
}

PYREE_MATH_FN double pyree_fabs(double x) {
  return pyree_from_bits(pyree_bits(x) & 0x7fffffffffffffffull);
}

PYREE_MATH_FN float pyree_copysignf(float x, float s) {
  return pyree_from_bitsf((pyree_bitsf(x) & 0x7fffffffu) | (pyree_bitsf(s) & 0x80000000u));
}

PYREE_MATH_FN double pyree_copysign(double x, double s) {
  return pyree_from_bits((pyree_bits(x) & 0x7fffffffffffffffull) | (pyree_bits(s) & 0x8000000000000000ull));
}

/* y * 2^n for n in [-252, 254]: two normal factors, so a subnormal result is rounded once. */
PYREE_MATH_FN float pyree_scalef(float y, int32_t n) {
  int32_t h = n >> 1;
  return y * pyree_from_bitsf((uint32_t)(h + 127) << 23) * pyree_from_bitsf((uint32_t)(n - h + 127) << 23);
}

/* y * 2^n for n in [-2044, 2046]. */
PYREE_MATH_FN double pyree_scale(double y, int32_t n) {
  int32_t h = n >> 1;
  return y * pyree_from_bits((uint64_t)(h + 1023) << 52) * pyree_from_bits((uint64_t)(n - h + 1023) << 52);
}

/* ---- min, max (arith.maximumf/minimumf propagate NaN; maxnumf/minnumf ignore it) -------- */

PYREE_MATH_FN float pyree_maximumf(float a, float b) {
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}

PYREE_MATH_FN float pyree_minimumf(float a, float b) {
  return (a != a || b != b) ? a + b : (a < b ? a : b);
}

PYREE_MATH_FN float pyree_maxnumf(float a, float b) {
  return a != a ? b : (b != b ? a : (a > b ? a : b));
}

PYREE_MATH_FN float pyree_minnumf(float a, float b) {
  return a != a ? b : (b != b ? a : (a < b ? a : b));
}

PYREE_MATH_FN double pyree_maximum(double a, double b) {
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}

PYREE_MATH_FN double pyree_minimum(double a, double b) {
  return (a != a || b != b) ? a + b : (a < b ? a : b);
}

PYREE_MATH_FN double pyree_maxnum(double a, double b) {
  return a != a ? b : (b != b ? a : (a > b ? a : b));
}

PYREE_MATH_FN double pyree_minnum(double a, double b) {
  return a != a ? b : (b != b ? a : (a < b ? a : b));
}

/* ---- rounding: (|x| + 2^23) - 2^23 rounds to the even neighbour (default rounding mode) -- */

PYREE_MATH_FN float pyree_roundevenf(float x) {
  float a = pyree_fabsf(x);
  float r = (a + 8388608.0f) - 8388608.0f;
  return a < 8388608.0f ? pyree_copysignf(r, x) : x;
}

PYREE_MATH_FN float pyree_floorf(float x) {
  float r = pyree_roundevenf(x);
  return r > x ? r - 1.0f : r;
}

PYREE_MATH_FN float pyree_ceilf(float x) {
  float r = pyree_roundevenf(x);
  return pyree_copysignf(r < x ? r + 1.0f : r, x);
}

PYREE_MATH_FN float pyree_truncf(float x) {
  return pyree_copysignf(pyree_floorf(pyree_fabsf(x)), x);
}

/* Halves away from zero (math.round); the fraction |x| - floor|x| is exact. */
PYREE_MATH_FN float pyree_roundf(float x) {
  float a = pyree_fabsf(x), t = pyree_floorf(a);
  return pyree_copysignf(a - t >= 0.5f ? t + 1.0f : t, x);
}

PYREE_MATH_FN double pyree_roundeven(double x) {
  double a = pyree_fabs(x);
  double r = (a + 4503599627370496.0) - 4503599627370496.0;
  return a < 4503599627370496.0 ? pyree_copysign(r, x) : x;
}

PYREE_MATH_FN double pyree_floor(double x) {
  double r = pyree_roundeven(x);
  return r > x ? r - 1.0 : r;
}

PYREE_MATH_FN double pyree_ceil(double x) {
  double r = pyree_roundeven(x);
  return pyree_copysign(r < x ? r + 1.0 : r, x);
}

PYREE_MATH_FN double pyree_trunc(double x) {
  return pyree_copysign(pyree_floor(pyree_fabs(x)), x);
}

PYREE_MATH_FN double pyree_round(double x) {
  double a = pyree_fabs(x), t = pyree_floor(a);
  return pyree_copysign(a - t >= 0.5 ? t + 1.0 : t, x);
}

/* ---- sqrt: the instruction; x < 0 is answered by a select, so no errno libcall remains ---- */

PYREE_MATH_FN float pyree_sqrtf(float x) {
#if defined(__CUDACC__) && !defined(__clang__) /* NVRTC, nvcc: their device sqrt; clang (HIP): the builtin */
  return sqrtf(x);
#else
  float r = __builtin_sqrtf(x < 0.0f ? 0.0f : x);
  return x < 0.0f ? pyree_from_bitsf(0x7fc00000u) : r;
#endif
}

PYREE_MATH_FN float pyree_rsqrtf(float x) {
  return 1.0f / pyree_sqrtf(x);
}

PYREE_MATH_FN double pyree_sqrt(double x) {
#if defined(__CUDACC__) && !defined(__clang__) /* NVRTC, nvcc: their device sqrt; clang (HIP): the builtin */
  return sqrt(x);
#else
  double r = __builtin_sqrt(x < 0.0 ? 0.0 : x);
  return x < 0.0 ? pyree_from_bits(0x7ff8000000000000ull) : r;
#endif
}

PYREE_MATH_FN double pyree_rsqrt(double x) {
  return 1.0 / pyree_sqrt(x);
}

/* ---- exp family ------------------------------------------------------------------------
 * e^x = 2^k e^r: k = round(x log2 e) by adding and subtracting 1.5 * 2^23 (2^52), r = x - k ln2
 * with ln2 in two parts (k times the first is exact), |r| <= ln2/2; e^r by its Taylor
 * polynomial (truncation below 2^-27 / 2^-57 relative); 2^k as two normal factors. */

PYREE_MATH_FN float pyree_expf(float x) {
  float xc = x != x ? 0.0f : (x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x));
  float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;
  float r = (xc - k * 0.693145752f) - k * 1.42860677e-6f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f + r * (0.00833333377f + r * (0.00138888892f + r * 0.000198412701f))))));
  float y = pyree_scalef(p, (int32_t)k);
  return x != x ? x : y;
}

/* 2^x = 2^k 2^r, k = round(x), r = x - k exact. */
PYREE_MATH_FN float pyree_exp2f(float x) {
  float xc = x != x ? 0.0f : (x < -152.0f ? -152.0f : (x > 129.0f ? 129.0f : x));
  float k = (xc + 12582912.0f) - 12582912.0f;
  float r = xc - k;
  float p = 1.0f + r * (0.693147182f + r * (0.240226507f + r * (0.0555041097f + r * (0.00961812865f + r * (0.00133335579f + r * (0.000154035297f + r * 1.52527336e-05f))))));
  float y = pyree_scalef(p, (int32_t)k);
  return x != x ? x : y;
}

/* e^x - 1 = 2^k (e^r - 1) + (2^k - 1), e^r - 1 = r + r^2 P(r): no cancellation near 0
 * (k = 0 is e^r - 1 itself). At k = 128 the scale is 2^127 and the sum doubles. */
PYREE_MATH_FN float pyree_expm1f(float x) {
  float xc = x != x ? 0.0f : (x < -30.0f ? -30.0f : (x > 89.0f ? 89.0f : x));
  float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;
  float r = (xc - k * 0.693145752f) - k * 1.42860677e-6f;
  float q = r + r * r * (0.5f + r * (0.166666672f + r * (0.0416666679f + r * (0.00833333377f + r * (0.00138888892f + r * (0.000198412701f + r * 2.48015876e-05f))))));
  int32_t n = (int32_t)k;
  int32_t m = n > 127 ? 127 : n;
  float s = pyree_from_bitsf((uint32_t)(m + 127) << 23);
  float y = (s * q + (s - 1.0f)) * (n > 127 ? 2.0f : 1.0f);
  y = n == 0 ? q : y;
  return (x != x || x == 0.0f) ? x : y;
}

/* 1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 (no overflow, subnormal results kept). */
PYREE_MATH_FN float pyree_sigmoidf(float x) {
  float e = pyree_expf(-pyree_fabsf(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

PYREE_MATH_FN double pyree_exp(double x) {
  double xc = x != x ? 0.0 : (x < -746.0 ? -746.0 : (x > 710.0 ? 710.0 : x));
  double k = (xc * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;
  double r = (xc - k * 0.6931471803691238) - k * 1.9082149292705877e-10;
  double p = 1.0 + r * (1.0 + r * (0.5 + r * (0.16666666666666666 + r * (0.041666666666666664 + r * (0.008333333333333333 + r * (0.001388888888888889 + r * (0.0001984126984126984 + r * (2.48015873015873e-05 + r * (2.7557319223985893e-06 + r * (2.755731922398589e-07 + r * (2.505210838544172e-08 + r * (2.08767569878681e-09 + r * 1.6059043836821613e-10))))))))))));
  double y = pyree_scale(p, (int32_t)k);
  return x != x ? x : y;
}

PYREE_MATH_FN double pyree_exp2(double x) {
  double xc = x != x ? 0.0 : (x < -1076.0 ? -1076.0 : (x > 1025.0 ? 1025.0 : x));
  double k = (xc + 6755399441055744.0) - 6755399441055744.0;
  double r = xc - k;
  double p = 1.0 + r * (0.6931471805599453 + r * (0.24022650695910072 + r * (0.05550410866482158 + r * (0.009618129107628477 + r * (0.0013333558146428443 + r * (0.0001540353039338161 + r * (1.5252733804059841e-05 + r * (1.321548679014431e-06 + r * (1.01780860092397e-07 + r * (7.054911620801123e-09 + r * (4.4455382718708116e-10 + r * (2.5678435993488206e-11 + r * 1.3691488853904128e-12))))))))))));
  double y = pyree_scale(p, (int32_t)k);
  return x != x ? x : y;
}

PYREE_MATH_FN double pyree_expm1(double x) {
  double xc = x != x ? 0.0 : (x < -40.0 ? -40.0 : (x > 710.0 ? 710.0 : x));
  double k = (xc * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;
  double r = (xc - k * 0.6931471803691238) - k * 1.9082149292705877e-10;
  double q = r + r * r * (0.5 + r * (0.16666666666666666 + r * (0.041666666666666664 + r * (0.008333333333333333 + r * (0.001388888888888889 + r * (0.0001984126984126984 + r * (2.48015873015873e-05 + r * (2.7557319223985893e-06 + r * (2.755731922398589e-07 + r * (2.505210838544172e-08 + r * (2.08767569878681e-09 + r * (1.6059043836821613e-10 + r * (1.1470745597729725e-11 + r * 7.647163731819816e-13)))))))))))));
  int32_t n = (int32_t)k;
  int32_t m = n > 1023 ? 1023 : n;
  double s = pyree_from_bits((uint64_t)(m + 1023) << 52);
  double y = (s * q + (s - 1.0)) * (n > 1023 ? 2.0 : 1.0);
  y = n == 0 ? q : y;
  return (x != x || x == 0.0) ? x : y;
}

PYREE_MATH_FN double pyree_sigmoid(double x) {
  double e = pyree_exp(-pyree_fabs(x));
  return (x >= 0.0 ? 1.0 : e) / (1.0 + e);
}

/* ---- log family ------------------------------------------------------------------------
 * x = 2^k m with m in [sqrt(1/2), sqrt(2)) (bits of x less those of sqrt(1/2): the exponent
 * field is k), f = m - 1, s = f / (2 + f): log(1 + f) = 2 atanh(s) = f - f^2/2 + s (f^2/2 + R)
 * with R = 2 z/3 + 2 z^2/5 + ... (z = s^2 <= 0.0295; Taylor, truncation below 2^-30 / 2^-58),
 * plus k ln2 in two parts. Subnormal x is scaled by 2^23 (2^54) first. */

PYREE_MATH_FN float pyree_logf(float x) {
  int sub = x < 1.17549435e-38f;
  float xs = sub ? x * 8388608.0f : x;
  uint32_t ix = pyree_bitsf(xs) - 0x3f3504f3u;
  float k = (float)(((int32_t)ix >> 23) - (sub ? 23 : 0));
  float f = pyree_from_bitsf((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  float s = f / (2.0f + f), z = s * s, hfsq = 0.5f * f * f;
  float R = z * (0.666666687f + z * (0.400000006f + z * (0.285714298f + z * (0.222222224f + z * 0.181818187f))));
  float y = s * (hfsq + R) + k * 1.42860677e-6f - hfsq + f + k * 0.693145752f;
  y = x == 0.0f ? -pyree_from_bitsf(0x7f800000u) : y;
  y = x < 0.0f ? pyree_from_bitsf(0x7fc00000u) : y;
  return (x != x || x == pyree_from_bitsf(0x7f800000u)) ? x : y;
}

/* log(1 + x) = log(u) + (x - (u - 1)) / u, u = 1 + x rounded: the second term is the
 * rounding error of u (exact), to first order. */
PYREE_MATH_FN float pyree_log1pf(float x) {
  float u = 1.0f + x;
  float y = pyree_logf(u) + (x - (u - 1.0f)) / u;
  y = x == -1.0f ? -pyree_from_bitsf(0x7f800000u) : y;
  return (pyree_fabsf(x) < 5.9604645e-8f || x != x || x == pyree_from_bitsf(0x7f800000u)) ? x : y;
}

PYREE_MATH_FN double pyree_log(double x) {
  /* Kept in double and 32-bit integers: with 64-bit ones the vectorizer finds no gain. */
  double sub = x < 2.2250738585072014e-308 ? 1.0 : 0.0;
  double xs = x * (sub * 18014398509481983.0 + 1.0);
  uint64_t ix = pyree_bits(xs) - 0x3fe6a09e667f3bcdull;
  double k = (double)((int32_t)(ix >> 32) >> 20) - sub * 54.0;
  double f = pyree_from_bits((ix & 0x000fffffffffffffull) + 0x3fe6a09e667f3bcdull) - 1.0;
  double s = f / (2.0 + f), z = s * s, hfsq = 0.5 * f * f;
  double R = z * (0.6666666666666666 + z * (0.4 + z * (0.2857142857142857 + z * (0.2222222222222222 + z * (0.18181818181818182 + z * (0.15384615384615385 + z * (0.13333333333333333 + z * (0.11764705882352941 + z * (0.10526315789473684 + z * 0.09523809523809523)))))))));
  double y = s * (hfsq + R) + k * 1.9082149292705877e-10 - hfsq + f + k * 0.6931471803691238;
  double special = x == 0.0 ? -pyree_from_bits(0x7ff0000000000000ull) : (x < 0.0 ? pyree_from_bits(0x7ff8000000000000ull) : x);
  return ((x > 0.0) & (x < pyree_from_bits(0x7ff0000000000000ull))) ? y : special;
}

PYREE_MATH_FN double pyree_log1p(double x) {
  double u = 1.0 + x;
  double y = pyree_log(u) + (x - (u - 1.0)) / u;
  y = x == -1.0 ? -pyree_from_bits(0x7ff0000000000000ull) : y;
  y = x < pyree_from_bits(0x7ff0000000000000ull) ? y : x;
  return pyree_fabs(x) >= 1.1102230246251565e-16 ? y : x;
}

/* ---- pow -------------------------------------------------------------------------------
 * |x|^y = 2^(y log2|x|) with log2|x| = k + log2(m): y k is split exactly (y's top 12 bits
 * times k, then the rest), so the error grows only with |y log2 m| (|log2 m| <= 1/2), not
 * with |y k|. The sign: negative x to an odd integer power; NaN for negative finite x and a
 * finite non-integer y. */
PYREE_MATH_FN float pyree_powf(float x, float y) {
  float ax = pyree_fabsf(x);
  int sub = ax < 1.17549435e-38f;
  float xs = sub ? ax * 8388608.0f : ax;
  uint32_t ix = pyree_bitsf(xs) - 0x3f3504f3u;
  float k = (float)(((int32_t)ix >> 23) - (sub ? 23 : 0));
  float f = pyree_from_bitsf((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  float s = f / (2.0f + f), z = s * s, hfsq = 0.5f * f * f;
  float R = z * (0.666666687f + z * (0.400000006f + z * (0.285714298f + z * (0.222222224f + z * 0.181818187f))));
  float l2m = (f - hfsq + s * (hfsq + R)) * 1.44269504f;
  float yh = pyree_from_bitsf(pyree_bitsf(y) & 0xfffff000u), yl = y - yh;
  float w = yh * k;
  float wc = w != w ? 0.0f : (w < -400.0f ? -400.0f : (w > 400.0f ? 400.0f : w));
  float n = (wc + 12582912.0f) - 12582912.0f;
  float rest = (w - n) + yl * k + y * l2m;
  float rc = rest != rest ? 0.0f : (rest < -400.0f ? -400.0f : (rest > 400.0f ? 400.0f : rest));
  float n2 = (rc + 12582912.0f) - 12582912.0f;
  float r = rc - n2;
  float p = 1.0f + r * (0.693147182f + r * (0.240226507f + r * (0.0555041097f + r * (0.00961812865f + r * (0.00133335579f + r * (0.000154035297f + r * 1.52527336e-05f))))));
  float e = n + n2;
  float ec = e < -200.0f ? -200.0f : (e > 200.0f ? 200.0f : e);
  float v = pyree_scalef(p, (int32_t)ec);
  /* infinities of x or y, 0^y: through log2|x| = +-inf */
  float lx = k + l2m;
  lx = ax == 0.0f ? -pyree_from_bitsf(0x7f800000u) : (ax == pyree_from_bitsf(0x7f800000u) ? ax : lx);
  float big = y * lx;
  v = (ax == 0.0f || ax == pyree_from_bitsf(0x7f800000u) || pyree_fabsf(y) == pyree_from_bitsf(0x7f800000u))
      ? (big > 0.0f ? pyree_from_bitsf(0x7f800000u) : (big < 0.0f ? 0.0f : 1.0f)) : v;
  v = ax == 1.0f ? 1.0f : v;
  float ty = pyree_truncf(y);
  int integer = ty == y;
  int odd = integer && pyree_fabsf(y) < 16777216.0f && pyree_truncf(y * 0.5f) * 2.0f != y;
  v = ((pyree_bitsf(x) >> 31) && odd) ? -v : v;
  v = (x < 0.0f && ax != pyree_from_bitsf(0x7f800000u) && !integer && y == y) ? pyree_from_bitsf(0x7fc00000u) : v;
  v = (x != x || y != y) ? x + y : v;
  return (y == 0.0f || x == 1.0f) ? 1.0f : v;
}

/* exp(y log|x|) in double: error grows with |y log x| (about |y log x| / 2 ulp). */
PYREE_MATH_FN double pyree_pow(double x, double y) {
  double ax = pyree_fabs(x);
  double v = pyree_exp(y * pyree_log(ax));
  v = ax == 1.0 ? 1.0 : v;
  double ty = pyree_trunc(y);
  int integer = ty == y;
  int odd = integer && pyree_fabs(y) < 9007199254740992.0 && pyree_trunc(y * 0.5) * 2.0 != y;
  v = ((pyree_bits(x) >> 63) && odd) ? -v : v;
  v = (x < 0.0 && ax != pyree_from_bits(0x7ff0000000000000ull) && !integer && y == y) ? pyree_from_bits(0x7ff8000000000000ull) : v;
  v = (x != x || y != y) ? x + y : v;
  return (y == 0.0 || x == 1.0) ? 1.0 : v;
}

/* A float to an integer power by repeated squaring, as LLVM's powi (math.fpowi: ONNX's Pow
 * with an integer exponent); a negative power is the reciprocal. 64 fixed steps of selects. */
PYREE_MATH_FN float pyree_powif(float a, int64_t n) {
  uint64_t m = n < 0 ? 0 - (uint64_t)n : (uint64_t)n;
  float r = 1.0f;
  for (int i = 0; i < 64; ++i) {
    r = (m >> i) & 1 ? r * a : r;
    a *= a;
  }
  return n < 0 ? 1.0f / r : r;
}

PYREE_MATH_FN double pyree_powi(double a, int64_t n) {
  uint64_t m = n < 0 ? 0 - (uint64_t)n : (uint64_t)n;
  double r = 1.0;
  for (int i = 0; i < 64; ++i) {
    r = (m >> i) & 1 ? r * a : r;
    a *= a;
  }
  return n < 0 ? 1.0 / r : r;
}

/* An integer to an integer power, wrapping as the integer type does (math.ipowi): a
 * negative power is 0 except for bases 1 and -1. */
PYREE_MATH_FN int64_t pyree_ipowi(int64_t a, int64_t n) {
  uint64_t r = 1, b = (uint64_t)a, m = (uint64_t)n;
  for (int i = 0; i < 63; ++i) {
    r = (m >> i) & 1 ? r * b : r;
    b *= b;
  }
  int64_t negative = a == 1 ? 1 : (a == -1 ? ((n & 1) ? -1 : 1) : 0);
  return n < 0 ? negative : (int64_t)r;
}

PYREE_MATH_FN int64_t pyree_imax(int64_t a, int64_t b) {
  return a > b ? a : b;
}

PYREE_MATH_FN int64_t pyree_imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* ---- tanh, erf -------------------------------------------------------------------------- */

/* |x| < 0.55: x + x^3 P(x^2) (a least-squares fit at Chebyshev nodes); above: 1 - 2/(e^2|x| + 1)
 * (>= 0.5, no cancellation); |x| clamped at 10 (tanh is 1 in float from 9.01). */
PYREE_MATH_FN float pyree_tanhf(float x) {
  float a = pyree_fabsf(x), t = a * a;
  float small = a + a * t * (-0.333333313f + t * (0.133331105f + t * (-0.0539088026f + t * (0.0213061161f + t * -0.00660485635f))));
  float e = pyree_expf(2.0f * (a > 10.0f ? 10.0f : a));
  float big = 1.0f - 2.0f / (e + 1.0f);
  return pyree_copysignf(a < 0.55f ? small : big, x);
}

/* e = e^2|x| - 1 (expm1), tanh|x| = e / (e + 2); |x| clamped at 20 (tanh is 1 in double from 19.1). */
PYREE_MATH_FN double pyree_tanh(double x) {
  double a = pyree_fabs(x);
  double e = pyree_expm1(2.0 * (a > 20.0 ? 20.0 : a));
  return pyree_copysign(e / (e + 2.0), x);
}

/* |x| < 1: x P(x^2) (fit); 1 <= |x|: 1 - e^-x^2 Q(1/|x|), Q(u) = erfc(1/u) e^(1/u^2) fitted
 * on [1/4, 1]; |x| clamped at 4 (erf is 1 in float from 3.92). */
PYREE_MATH_FN float pyree_erff(float x) {
  float a = pyree_fabsf(x);
  a = a > 4.0f ? 4.0f : a;
  float t = a * a;
  float small = a * (1.12837911f + t * (-0.37612319f + t * (0.112801306f + t * (-0.0267099496f + t * (0.00491602346f + t * -0.000562539615f)))));
  float b = a < 1.0f ? 1.0f : a;
  float u = 1.0f / b;
  float big = 1.0f - pyree_expf(-b * b) * (0.000263527094f + u * (0.559143901f + u * (0.0413551107f + u * (-0.469251364f + u * (0.491550475f + u * (-0.234270692f + u * (0.0172128119f + u * (0.0316555426f + u * -0.0100757703f))))))));
  return pyree_copysignf(a < 1.0f ? small : big, x);
}

/* |x| < 1: x P(x^2), P erf's Taylor series to x^41; 1 <= |x|: 1 - e^-x^2 Q, Q(u) =
 * erfc(1/u) e^(1/u^2) as a Chebyshev fit of degree 22 on u in [1/6, 1] (v = its place in
 * [-1, 1]); |x| clamped at 6 (erf is 1 in double from 5.93). */
PYREE_MATH_FN double pyree_erf(double x) {
  double a = pyree_fabs(x);
  a = a > 6.0 ? 6.0 : a;
  double t = a * a;
  double small = a * (1.1283791670955126 + t * (-0.37612638903183754 + t * (0.11283791670955126 + t * (-0.026866170645131252 + t * (0.005223977625442188 + t * (-0.0008548327023450853 + t * (0.00012055332981789664 + t * (-1.492565035840625e-05 + t * (1.6462114365889248e-06 + t * (-1.6365844691234924e-07 + t * (1.4807192815879218e-08 + t * (-1.2290555301717928e-09 + t * (9.422759064650411e-11 + t * (-6.7113668551641105e-12 + t * (4.4632242632864775e-13 + t * (-2.7835162072109215e-14 + t * (1.6342614095367152e-15 + t * (-9.063970842808673e-17 + t * (4.763348040515068e-18 + t * (-2.3784598852774293e-19 + t * 1.131218725924631e-20))))))))))))))))))));
  double b = a < 1.0 ? 1.0 : a;
  double v = (1.0 / b - 0.58333333333333337) * 2.4;
  double big = 1.0 - pyree_exp(-b * b) * (0.28972211632346423 + v * (0.16536269001261378 + v * (-0.030831050508428957 + v * (0.0028211318979441988 + v * (0.001034432226243832 + v * (-0.000738386744378545 + v * (0.00026560546936176547 + v * (-5.5286482242773355e-05 + v * (-4.0466321082941995e-06 + v * (1.0882579004236595e-05 + v * (-6.498014882924273e-06 + v * (2.583318217343318e-06 + v * (-6.637226189498863e-07 + v * (9.431441139548254e-10 + v * (1.2734368508267976e-07 + v * (-9.412364890420742e-08 + v * (4.5567309494394506e-08 + v * (-1.920508206162014e-08 + v * (7.081724035840848e-09 + v * (4.743867318847752e-10 + v * (-2.907332423483101e-09 + v * (1.5076762952001108e-09 + v * -2.482442634315902e-10))))))))))))))))))))));
  return pyree_copysign(a < 1.0 ? small : big, x);
}

/* ---- faster forms: fewer terms, for kernels whose tolerance allows them ---------------------
 *
 * A generated kernel calling exp, erf, tanh or sigmoid in float declares the knob
 * PYREE_FAST_MATH (0 by default): at 1 each such call takes the form below. `pyree-build tune`
 * sweeps it and keeps it only where that variant still passes the check against the
 * reference, so a group whose tolerance is tighter than these bounds keeps the exact forms.
 * Bounds (tests/models/test_math_inline.py, the same sweep as above):
 *
 *   expf_fast      2.5 ulp                   degree 5 (pyree_expf: 7)
 *   sigmoidf_fast  3.5 ulp
 *   erff_fast      6.5 ulp (6.34)            one rational function, no exp (pyree_erff: two fits, an exp)
 *   tanhf_fast     2e-7 absolute; 0 at 0     1 - 2 / (e^2|x| + 1) over the whole range
 *
 * Measured (1M floats in [-5, 5], zig cc -O2, baseline x86-64): exp 1.13x, sigmoid 1.10x,
 * erf 3.16x (2.44x under AVX-512), tanh 1.30x faster than the exact forms.
 */

/* e^x as pyree_expf, e^r by a degree-5 polynomial fitted for relative error on |r| <= ln2/2. */
PYREE_MATH_FN float pyree_expf_fast(float x) {
  float xc = x != x ? 0.0f : (x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x));
  float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;
  float r = (xc - k * 0.693145752f) - k * 1.42860677e-6f;
  float p = 1.0f + r * (1.0f + r * (0.499991417f + r * (0.166668862f + r * (0.0418985635f + r * 0.00833381899f))));
  float y = pyree_scalef(p, (int32_t)k);
  return x != x ? x : y;
}

PYREE_MATH_FN float pyree_sigmoidf_fast(float x) {
  float e = pyree_expf_fast(-pyree_fabsf(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* erf|x| = |x| P(x^2) / Q(x^2) on [0, 4], one rational function of degree 5 over 5 (fitted here
 * for relative error, 2.5e-8 in exact arithmetic; every coefficient positive, so nothing cancels):
 * no exp and one division, where pyree_erff computes two fits, an exp and a division. |x| clamped at
 * 4 and the result at 1 (erf is 1 in float from 3.92). */
PYREE_MATH_FN float pyree_erff_fast(float x) {
  float a = pyree_fabsf(x);
  a = a > 4.0f ? 4.0f : a;
  float t = a * a;
  float p = 1.12837911f + t * (0.193538934f + t * (0.053100951f + t * (0.00388308591f + t * (0.000284560898f + t * 1.98683938e-06f))));
  float q = 1.0f + t * (0.504851997f + t * (0.115347482f + t * (0.0152067337f + t * (0.00118551007f + t * 3.74205047e-05f))));
  float r = a * p / q;
  return pyree_copysignf(r > 1.0f ? 1.0f : r, x);
}

PYREE_MATH_FN float pyree_tanhf_fast(float x) {
  float a = pyree_fabsf(x);
  float e = pyree_expf_fast(2.0f * (a > 10.0f ? 10.0f : a));
  return pyree_copysignf(1.0f - 2.0f / (e + 1.0f), x);
}

#endif /* PYREE_BUILD_MATH_INLINE_H_ */
