//! pyree_build's freestanding math library, the part written in Zig (libm.py builds the whole).
//!
//! Standalone plugins and embedded objects have no libc: IREE's ELF loader links nothing.
//! The library for each arch is this file, zig's compiler_rt (exp, log, sqrt, sin, cos,
//! floor, fmin, ... for float and double) and a few of the musl sources zig ships (pow,
//! erf, atan2: the accurate table-driven ones). This file adds the functions neither has,
//! as C-ABI wrappers around zig's std.math (ports of musl's own code).
//!
//! Every symbol is weak and hidden, as compiler_rt's are: a definition in the plugin
//! itself wins, and none becomes an export of the plugin the loader could see.

const std = @import("std");
const math = std.math;

fn put(comptime function: anytype, comptime name: []const u8) void {
    @export(function, .{ .name = name, .linkage = .weak, .visibility = .hidden });
}

/// `name` of std.math as the C functions `name` (double) and `name`f (float).
fn unary(comptime name: []const u8) void {
    const wrap = struct {
        fn single(x: f32) callconv(.c) f32 {
            return @field(math, name)(x);
        }
        fn double(x: f64) callconv(.c) f64 {
            return @field(math, name)(x);
        }
    };
    put(&wrap.single, name ++ "f");
    put(&wrap.double, name);
}

fn binary(comptime name: []const u8) void {
    const wrap = struct {
        fn single(x: f32, y: f32) callconv(.c) f32 {
            return @field(math, name)(x, y);
        }
        fn double(x: f64, y: f64) callconv(.c) f64 {
            return @field(math, name)(x, y);
        }
    };
    put(&wrap.single, name ++ "f");
    put(&wrap.double, name);
}

/// Round to the nearest integer, ties to even (the default rounding mode, the only one a
/// kernel runs in): adding and removing 2^(mantissa bits) drops the fraction exactly so.
fn roundEven(comptime T: type, x: T) T {
    const big: T = 1.0 / math.floatEps(T);
    if (!(@abs(x) < big)) return x; // already an integer, or inf/nan
    const y = if (x < 0) (x - big) + big else (x + big) - big;
    return if (y == 0) math.copysign(@as(T, 0), x) else y;
}

fn rintf(x: f32) callconv(.c) f32 {
    return roundEven(f32, x);
}
fn rint(x: f64) callconv(.c) f64 {
    return roundEven(f64, x);
}
fn ldexpf(x: f32, n: c_int) callconv(.c) f32 {
    return math.ldexp(x, n);
}
fn ldexp(x: f64, n: c_int) callconv(.c) f64 {
    return math.ldexp(x, n);
}
fn frexpf(x: f32, e: *c_int) callconv(.c) f32 {
    const r = math.frexp(x);
    e.* = r.exponent;
    return r.significand;
}
fn frexp(x: f64, e: *c_int) callconv(.c) f64 {
    const r = math.frexp(x);
    e.* = r.exponent;
    return r.significand;
}
fn modff(x: f32, whole: *f32) callconv(.c) f32 {
    const r = math.modf(x);
    whole.* = r.ipart;
    return r.fpart;
}
fn modf(x: f64, whole: *f64) callconv(.c) f64 {
    const r = math.modf(x);
    whole.* = r.ipart;
    return r.fpart;
}

comptime {
    for (.{ "tanh", "sinh", "cosh", "asinh", "acosh", "atanh", "atan", "asin", "acos", "cbrt", "expm1", "log1p" }) |name| {
        unary(name);
    }
    for (.{ "hypot", "copysign" }) |name| {
        binary(name);
    }
    put(&rintf, "rintf");
    put(&rint, "rint");
    put(&rintf, "nearbyintf"); // no floating-point exceptions are observed here: the same
    put(&rint, "nearbyint");
    put(&ldexpf, "ldexpf");
    put(&ldexp, "ldexp");
    put(&ldexpf, "scalbnf");
    put(&ldexp, "scalbn");
    put(&frexpf, "frexpf");
    put(&frexp, "frexp");
    put(&modff, "modff");
    put(&modf, "modf");
}
