/* <math.h> for freestanding code: standalone plugins and embedded objects built by pyree_build.
 *
 * IREE's own ELF loader links no library, so there is no libc <math.h> to include. pyree_build
 * compiles this header's functions into a small math library per arch (backends/llvm_cpu/libm.py)
 * and links into a plugin or object the ones it calls, and only those. Declarations only:
 * no long double functions, no errno (math_errhandling is MATH_ERREXCEPT, as in musl), and
 * the floating-point environment is never changed, so rint and nearbyint round to nearest even.
 * Functions the compiler can inline (fabs, sqrt, fmin, ...) are macros over its builtins: a
 * loop calling them still vectorizes, which -fno-builtin would otherwise prevent.
 */
#ifndef PYREE_BUILD_FREESTANDING_MATH_H_
#define PYREE_BUILD_FREESTANDING_MATH_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef float float_t;
typedef double double_t;

#define HUGE_VALF __builtin_huge_valf()
#define HUGE_VAL __builtin_huge_val()
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")

#define FP_NAN 0
#define FP_INFINITE 1
#define FP_ZERO 2
#define FP_SUBNORMAL 3
#define FP_NORMAL 4
#define MATH_ERRNO 1
#define MATH_ERREXCEPT 2
#define math_errhandling MATH_ERREXCEPT

#define fpclassify(x) __builtin_fpclassify(FP_NAN, FP_INFINITE, FP_NORMAL, FP_SUBNORMAL, FP_ZERO, x)
#define isnan(x) __builtin_isnan(x)
#define isinf(x) __builtin_isinf(x)
#define isfinite(x) __builtin_isfinite(x)
#define isnormal(x) __builtin_isnormal(x)
#define signbit(x) __builtin_signbit(x)
#define isgreater(x, y) __builtin_isgreater(x, y)
#define isgreaterequal(x, y) __builtin_isgreaterequal(x, y)
#define isless(x, y) __builtin_isless(x, y)
#define islessequal(x, y) __builtin_islessequal(x, y)
#define islessgreater(x, y) __builtin_islessgreater(x, y)
#define isunordered(x, y) __builtin_isunordered(x, y)

/* POSIX constants: kernels use them, and strict -std=c17 would hide them in a libc's header. */
#define M_E 2.7182818284590452354
#define M_LOG2E 1.4426950408889634074
#define M_LOG10E 0.43429448190325182765
#define M_LN2 0.69314718055994530942
#define M_LN10 2.30258509299404568402
#define M_PI 3.14159265358979323846
#define M_PI_2 1.57079632679489661923
#define M_PI_4 0.78539816339744830962
#define M_1_PI 0.31830988618379067154
#define M_2_PI 0.63661977236758134308
#define M_2_SQRTPI 1.12837916709551257390
#define M_SQRT2 1.41421356237309504880
#define M_SQRT1_2 0.70710678118654752440

/* Each line: the float function and the double one. */
float expf(float);            double exp(double);
float exp2f(float);           double exp2(double);
float expm1f(float);          double expm1(double);
float logf(float);            double log(double);
float log2f(float);           double log2(double);
float log10f(float);          double log10(double);
float log1pf(float);          double log1p(double);
float powf(float, float);     double pow(double, double);
float sqrtf(float);           double sqrt(double);
float cbrtf(float);           double cbrt(double);
float hypotf(float, float);   double hypot(double, double);
float sinf(float);            double sin(double);
float cosf(float);            double cos(double);
float tanf(float);            double tan(double);
void sincosf(float, float*, float*);
void sincos(double, double*, double*);
float asinf(float);           double asin(double);
float acosf(float);           double acos(double);
float atanf(float);           double atan(double);
float atan2f(float, float);   double atan2(double, double);
float sinhf(float);           double sinh(double);
float coshf(float);           double cosh(double);
float tanhf(float);           double tanh(double);
float asinhf(float);          double asinh(double);
float acoshf(float);          double acosh(double);
float atanhf(float);          double atanh(double);
float erff(float);            double erf(double);
float erfcf(float);           double erfc(double);
float fabsf(float);           double fabs(double);
float fminf(float, float);    double fmin(double, double);
float fmaxf(float, float);    double fmax(double, double);
float fmodf(float, float);    double fmod(double, double);
float fmaf(float, float, float);
double fma(double, double, double);
float copysignf(float, float);
double copysign(double, double);
float floorf(float);          double floor(double);
float ceilf(float);           double ceil(double);
float truncf(float);          double trunc(double);
float roundf(float);          double round(double);
float rintf(float);           double rint(double);
float nearbyintf(float);      double nearbyint(double);
float ldexpf(float, int);     double ldexp(double, int);
float scalbnf(float, int);    double scalbn(double, int);
float frexpf(float, int*);    double frexp(double, int*);
float modff(float, float*);   double modf(double, double*);

/* Builtins the compiler lowers to instructions (or, where the CPU has none, to a call into
 * the library above). A function-like macro leaves `(fabsf)(x)` and `&fabsf` the real function. */
#define fabsf(x) __builtin_fabsf(x)
#define fabs(x) __builtin_fabs(x)
#define copysignf(x, y) __builtin_copysignf(x, y)
#define copysign(x, y) __builtin_copysign(x, y)
#define sqrtf(x) __builtin_sqrtf(x)
#define sqrt(x) __builtin_sqrt(x)
#define fminf(x, y) __builtin_fminf(x, y)
#define fmin(x, y) __builtin_fmin(x, y)
#define fmaxf(x, y) __builtin_fmaxf(x, y)
#define fmax(x, y) __builtin_fmax(x, y)

#ifdef __cplusplus
}
#endif

#endif /* PYREE_BUILD_FREESTANDING_MATH_H_ */
