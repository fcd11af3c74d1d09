/* What the native client's two parts share: transport.c (main: the request to the per-user
 * server, or the Python CLI in process) and plan_runner.c (a remembered `run` replayed without
 * the server, client/plans.py). Each .c file includes this header first. */
#ifndef PYREE_CLIENT_H
#define PYREE_CLIENT_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

extern char **environ;
/* protocol.boot_argv's Python, BOOT and package directory, and identity() (transport.c sets them). */
extern const char *g_python, *g_identity, *g_boot, *g_package;

static inline uint64_t fnv(uint64_t h, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001B3ULL;
  return h;
}

struct buf {
  char *p;
  size_t n, cap;
};

static inline void put(struct buf *b, const char *s, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 4096;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

static inline void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* A /proc file whole into `out` (NUL-terminated); its length, or -1 if it cannot be read. */
static inline ssize_t slurp(const char *path, char *out, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t n = 0;
  ssize_t r = 0;
  while (n + 1 < size && (r = read(fd, out + n, size - 1 - n)) > 0) n += (size_t)r;
  close(fd);
  if (r < 0) return -1;
  out[n] = 0;
  return (ssize_t)n;
}

/* transport.c: run the command in process, the Python CLI with the server off (`why`, if not
 * NULL, said first); returns only when that cannot be started. */
int in_process(int argc, char **argv, const char *why);

/* plan_runner.c: the command's exit code when this client ran it from a current plan in the
 * socket directory `dir`; -1 when there is none (the server runs it). */
int run_plan(const char *dir, int argc, char **argv);

#endif
