/* Force-included (-include) into each musl source of the freestanding math library (libm.py):
 * makes weak the symbols that file defines, named by -DPYREE_WEAK_1=... and -DPYREE_WEAK_2=...
 * `#pragma weak` before the definition makes the definition weak; it must not name a symbol the
 * file only refers to, or the reference turns weak and no longer pulls its archive member. */
#define PYREE_WEAK_STR(x) #x
#define PYREE_WEAK(name) _Pragma(PYREE_WEAK_STR(weak name))
#ifdef PYREE_WEAK_1
PYREE_WEAK(PYREE_WEAK_1)
#endif
#ifdef PYREE_WEAK_2
PYREE_WEAK(PYREE_WEAK_2)
#endif
