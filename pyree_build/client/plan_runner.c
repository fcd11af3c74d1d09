/* The native client's runs of a plan (client/plans.py), without the server.
 * A `run` command line that passed before, written down with the stat of every file it read:
 * while all are unchanged, this client runs the tool itself and, when it exits 0 with the same
 * stdout and result bytes, prints what pyree_build printed then. Anything else is handed, as it
 * happened, to the Python CLI, which checks and reports it (PYREE_BUILD_RAN). */
#include "client.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every arch since Linux 5.3 */
#endif

#define PLAN_MAGIC "pyree-plan-2\n"
#define PLAN_QUIET 1
#define PLAN_CHECK_LINE 2
static volatile sig_atomic_t g_stop = 0;

struct reader {
  const char *p, *end;
  int ok;
};

static uint32_t rd_u32(struct reader *r) {
  uint32_t v = 0;
  if (r->end - r->p < 4) return r->ok = 0, 0;
  memcpy(&v, r->p, 4), r->p += 4; /* little-endian hosts only: x86_64, aarch64, riscv64 */
  return v;
}

static int64_t rd_i64(struct reader *r) {
  int64_t v = 0;
  if (r->end - r->p < 8) return r->ok = 0, 0;
  memcpy(&v, r->p, 8), r->p += 8;
  return v;
}

static const char *rd_blob(struct reader *r, uint32_t *n) {
  *n = rd_u32(r);
  if (!r->ok || (size_t)(r->end - r->p) < *n) return r->ok = 0, NULL;
  const char *at = r->p;
  r->p += *n;
  return at;
}

static int by_bytes(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* plans.key_material: identity, cwd, the argument count and arguments, each ended by a
 * NUL, then every NAME=VALUE of the environment, sorted as bytes, each ended by a NUL. */
static int key_material(int argc, char **argv, struct buf *b) {
  char cwd[PATH_MAX], count[16];
  if (!getcwd(cwd, sizeof cwd)) return 0;
  snprintf(count, sizeof count, "%d", argc - 1);
  const char *head[] = {g_identity, cwd, count};
  for (size_t i = 0; i < 3; i++) put(b, head[i], strlen(head[i]) + 1);
  for (int i = 1; i < argc; i++) put(b, argv[i], strlen(argv[i]) + 1);
  size_t n = 0;
  while (environ[n]) n++;
  char **sorted = malloc((n + 1) * sizeof *sorted);
  if (!sorted) return 0;
  memcpy(sorted, environ, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, by_bytes);
  for (size_t i = 0; i < n; i++) put(b, sorted[i], strlen(sorted[i]) + 1);
  free(sorted);
  return 1;
}

/* The plan for this command line, whole, if this user wrote it: NULL when there is none. */
static char *read_plan(const char *dir, int argc, char **argv, char *path, size_t path_size, struct buf *material, size_t *size) {
  if (!key_material(argc, argv, material)) return NULL;
  snprintf(path, path_size, "%s/plans/%016llx", dir, (unsigned long long)fnv(0xCBF29CE484222325ULL, material->p, material->n));
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd < 0) return NULL;
  char *data = NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022) && st.st_size < (16 << 20) &&
      (data = malloc((size_t)st.st_size + 1)) != NULL) {
    size_t n = 0;
    ssize_t r = 1;
    while (n < (size_t)st.st_size && ((r = read(fd, data + n, (size_t)st.st_size - n)) > 0 || (r < 0 && errno == EINTR)))
      if (r > 0) n += (size_t)r;
    if (n != (size_t)st.st_size) free(data), data = NULL;
    *size = n;
  }
  close(fd);
  return data;
}

/* Every file the plan names has the stat it had (stat follows links: where a path leads counts). */
static int files_unchanged(struct reader *r) {
  uint32_t count = rd_u32(r), n;
  char name[PATH_MAX];
  for (uint32_t i = 0; r->ok && i < count; i++) {
    const char *text = rd_blob(r, &n);
    int64_t want[5];
    for (int k = 0; k < 5; k++) want[k] = rd_i64(r);
    struct stat st;
    if (!r->ok || n >= sizeof name) return 0;
    memcpy(name, text, n), name[n] = 0;
    if (stat(name, &st) != 0) return 0;
    int64_t have[5] = {(int64_t)st.st_dev, (int64_t)st.st_ino, (int64_t)st.st_size,
                       (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec, (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec};
    if (memcmp(want, have, sizeof want) != 0) return 0;
  }
  return r->ok;
}

/* The plan was written by this pyree_build: its code digest is the one its install's code file
 * (plans/code-FNV of the identity) names, and every file listed there has the stat it had. */
static int code_current(const char *dir, struct reader *r) {
  static char data[1 << 20];
  char path[PATH_MAX];
  uint32_t n = 0, m = 0;
  const char *digest = rd_blob(r, &n);
  snprintf(path, sizeof path, "%s/plans/code-%016llx", dir, (unsigned long long)fnv(0xCBF29CE484222325ULL, g_identity, strlen(g_identity)));
  ssize_t size = r->ok ? slurp(path, data, sizeof data) : -1;
  if (size <= 0) return 0;
  struct reader code = {data, data + size, 1};
  const char *named = rd_blob(&code, &m);
  return code.ok && m == n && !memcmp(named, digest, n) && files_unchanged(&code);
}

struct plan {
  char **argv;
  int64_t timeout_ms;
  const char *stdout_, *printed, *prefix, *suffix, **results;
  uint32_t stdout_n, printed_n, prefix_n, suffix_n, nresults, *result_n, flags;
};

/* The rest of the plan, the results directory put where the argv has a NUL. */
static int parse_plan(struct reader *r, const char *results_dir, struct plan *p) {
  uint32_t argc = rd_u32(r), n;
  if (!r->ok || argc == 0 || argc > 4096 || !(p->argv = calloc(argc + 1, sizeof *p->argv))) return 0;
  for (uint32_t i = 0; i < argc; i++) {
    const char *text = rd_blob(r, &n);
    if (!r->ok) return 0;
    struct buf arg = {0};
    for (uint32_t k = 0; k < n; k++)
      if (text[k]) put(&arg, text + k, 1);
      else puts_(&arg, results_dir);
    put(&arg, "", 1);
    p->argv[i] = arg.p;
  }
  p->timeout_ms = rd_i64(r);
  p->stdout_ = rd_blob(r, &p->stdout_n);
  p->nresults = rd_u32(r);
  if (!r->ok || p->nresults > 1024) return 0;
  p->results = calloc(p->nresults + 1, sizeof *p->results), p->result_n = calloc(p->nresults + 1, sizeof *p->result_n);
  for (uint32_t i = 0; p->results && p->result_n && i < p->nresults; i++) p->results[i] = rd_blob(r, &p->result_n[i]);
  p->flags = rd_u32(r);
  p->printed = rd_blob(r, &p->printed_n), p->prefix = rd_blob(r, &p->prefix_n), p->suffix = rd_blob(r, &p->suffix_n);
  return r->ok && p->results && p->result_n;
}

static void on_stop(int sig) { g_stop = sig; }

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* SIGKILL for the tool's group and every other child this client has (the tool's orphans,
 * reparented to this subreaper), each reaped. */
static void end_children(pid_t tool) {
  char path[64], text[4096];
  kill(-tool, SIGKILL);
  snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
  for (int round = 0, ended = 1; ended && round < 100; round++) {
    ended = 0;
    if (slurp(path, text, sizeof text) <= 0) break;
    for (char *tok = strtok(text, " \n"); tok; tok = strtok(NULL, " \n")) {
      pid_t child = (pid_t)strtol(tok, NULL, 10);
      if (child > 0 && child != tool) kill(child, SIGKILL), waitpid(child, NULL, 0), ended = 1;
    }
  }
}

/* Read what is ready on `fd` into `b`; 0 at its end. */
static int drain(int fd, struct buf *b) {
  char chunk[65536];
  ssize_t r = read(fd, chunk, sizeof chunk);
  if (r < 0) return errno == EINTR || errno == EAGAIN;
  if (r > 0) put(b, chunk, (size_t)r);
  return r > 0;
}

struct ran {
  int status, timed_out;
  double seconds;
  struct buf out, err;
};

/* Run argv in a session of its own (ended with this client), stdout and stderr captured, within
 * timeout_ms; the tool's orphans are ended when it exits. -1 if it could not be started. */
static int run_tool(char **argv, int64_t timeout_ms, struct ran *ran) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return -1;
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction sa = {.sa_handler = on_stop};
  sigaction(SIGINT, &sa, NULL), sigaction(SIGTERM, &sa, NULL), sigaction(SIGHUP, &sa, NULL);
  signal(SIGXFSZ, SIG_IGN); /* past `ulimit -f` a write fails here, as in Python, which ignores it too */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) {
    setsid();
    signal(SIGXFSZ, SIG_DFL); /* the tool gets it, as Popen's restore_signals gives it */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0), dup2(out[1], 1), dup2(err[1], 2);
    execv(argv[0], argv);
    _exit(127);
  }
  close(out[1]), close(err[1]);
  if (pid < 0) return close(out[0]), close(err[0]), -1;
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0), open_out = 1, open_err = 1, exited = 0, status = 0;
  int64_t deadline = timeout_ms >= 0 ? now_ms() + timeout_ms : -1;
  while ((open_out || open_err || !exited) && !g_stop) {
    struct pollfd fds[3] = {{out[0], open_out ? POLLIN : 0, 0}, {err[0], open_err ? POLLIN : 0, 0}, {pidfd, exited ? 0 : POLLIN, 0}};
    int64_t wait = deadline < 0 ? -1 : deadline - now_ms();
    if (!exited && pidfd < 0 && (wait < 0 || wait > 1)) wait = 1; /* no pidfd (Linux < 5.3): waitpid every ms */
    if (deadline >= 0 && wait <= 0) {
      ran->timed_out = 1;
      break;
    }
    if (poll(fds, pidfd >= 0 ? 3 : 2, (int)wait) < 0 && errno != EINTR) break;
    if (open_out && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) open_out = drain(out[0], &ran->out);
    if (open_err && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) open_err = drain(err[0], &ran->err);
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = 1, end_children(pid);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!exited) { /* a stop or the time limit: its group and orphans ended, what it printed read */
    end_children(pid);
    waitpid(pid, &status, 0);
    int64_t until = now_ms() + 5000;
    while ((open_out || open_err) && now_ms() < until) {
      struct pollfd fds[2] = {{out[0], open_out ? POLLIN : 0, 0}, {err[0], open_err ? POLLIN : 0, 0}};
      if (poll(fds, 2, 100) < 0 && errno != EINTR) break;
      if (open_out && fds[0].revents) open_out = drain(out[0], &ran->out);
      if (open_err && fds[1].revents) open_err = drain(err[0], &ran->err);
    }
  }
  close(out[0]), close(err[0]);
  if (pidfd >= 0) close(pidfd);
  ran->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  ran->status = WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
  return 0;
}

static int same_bytes(const char *path, const char *want, uint32_t n) {
  static char have[1 << 20];
  ssize_t got = slurp(path, have, sizeof have);
  return got == (ssize_t)n && !memcmp(have, want, n);
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    p += w, n -= (size_t)w;
  }
  return 1;
}

/* What pyree_build printed for this run: its stdout is buffered until the command ends
 * (line by line on a terminal), the check line goes out at once. 0, or the fd (1 or 2) that
 * refused a write (a full disk, /dev/full, `ulimit -f`), errno saying why. */
static int print_as_before(const struct plan *p, double seconds) {
  if (p->flags & PLAN_QUIET) return 0;
  char number[64];
  struct buf line = {0};
  if (p->flags & PLAN_CHECK_LINE) {
    snprintf(number, sizeof number, "%.2f", seconds);
    put(&line, p->prefix, p->prefix_n), puts_(&line, number), put(&line, p->suffix, p->suffix_n);
  }
  size_t early = 0;
  if (isatty(1))
    for (size_t i = p->printed_n; i > 0 && !early; i--)
      if (p->printed[i - 1] == '\n') early = i;
  int lost = !write_all(1, p->printed, early) ? 1 : line.n && !write_all(2, line.p, line.n) ? 2 : !write_all(1, p->printed + early, p->printed_n - early) ? 1 : 0;
  free(line.p);
  return lost;
}

/* The output is lost, so the run did not pass: said as the Python CLI says it (cli._NamedStream)
 * where stderr still takes it. */
static int output_lost(int fd) {
  int err = errno;
  char target[PATH_MAX] = "", path[64];
  struct rlimit limit;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  target[n > 0 ? n : 0] = 0;
  dprintf(2, "error: cannot write to %s%s%s%s: %s\n", fd == 1 ? "standard output" : "standard error", target[0] ? " (" : "", target, target[0] ? ")" : "", strerror(err));
  int limited = getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  if (limited)
    dprintf(2, "  fix: the file size limit (`ulimit -f`) is %llu bytes: raise it (`ulimit -f unlimited`)\n", (unsigned long long)limit.rlim_cur);
  else
    dprintf(2, "  fix: free space on that file system (or raise the quota), or send the output elsewhere\n");
  return 1;
}

static void remove_results(const char *dir, uint32_t nresults) {
  char path[PATH_MAX + 32];
  for (uint32_t k = 0; k < nresults; k++) snprintf(path, sizeof path, "%s/result%u.npy", dir, k), unlink(path);
  rmdir(dir);
}

/* `b` for the Python CLI this process becomes: the read end of a pipe holding it all (no file
 * size limit applies to a pipe), else (more than a pipe holds) a file `name` in `dir`, fd -1.
 * -2 when neither could take it. */
static int pass_bytes(const char *dir, const char *name, const struct buf *b) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) == 0) {
    if (b->n > 65536) fcntl(p[1], F_SETPIPE_SZ, (int)(b->n < (1 << 20) ? b->n : (1 << 20)));
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    int whole = write_all(p[1], b->p ? b->p : "", b->n);
    close(p[1]);
    if (whole && fcntl(p[0], F_SETFD, 0) == 0) return p[0];
    close(p[0]);
  }
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -2;
  int whole = write_all(fd, b->p ? b->p : "", b->n);
  return close(fd) == 0 && whole ? -1 : -2;
}

/* Hand the run to the Python CLI, which checks and reports it as if it had run the tool
 * (plans.take_outcome): never run again, so a failure is never retried into a pass. */
static int hand_over(int argc, char **argv, const struct ran *ran, const char *results_dir, const char *plan_path) {
  char spec[2 * PATH_MAX + 128];
  int out = pass_bytes(results_dir, "stdout", &ran->out), err = out == -2 ? -2 : pass_bytes(results_dir, "stderr", &ran->err);
  if (out == -2 || err == -2) {
    fprintf(stderr, "error: cannot keep what %s printed in %s: %s\n", "iree-run-module", results_dir, strerror(errno));
    return 1;
  }
  snprintf(spec, sizeof spec, "v2 %d %d %.17g %d %d %s %s", ran->status, ran->timed_out, ran->seconds, out, err, results_dir, plan_path);
  setenv("PYREE_BUILD_RAN", spec, 1);
  return in_process(argc, argv, NULL);
}

/* The command's exit code when this client ran it from a plan; -1 when there is no current
 * plan (the server runs it). */
int run_plan(const char *dir, int argc, char **argv) {
  char path[PATH_MAX], results_dir[PATH_MAX];
  struct buf material = {0};
  size_t size = 0;
  int code = -1, lost = 0;
  char *data = read_plan(dir, argc, argv, path, sizeof path, &material, &size);
  struct reader r = {data, data + size, 1};
  uint32_t n = 0;
  const char *key = data && size > strlen(PLAN_MAGIC) && !memcmp(data, PLAN_MAGIC, strlen(PLAN_MAGIC)) ? (r.p += strlen(PLAN_MAGIC), rd_blob(&r, &n)) : NULL;
  const char *tmp = getenv("TMPDIR");
  struct stat st;
  snprintf(results_dir, sizeof results_dir, "%s/pyree-run.XXXXXX", tmp && tmp[0] == '/' && stat(tmp, &st) == 0 && S_ISDIR(st.st_mode) ? tmp : "/tmp");
  struct plan p = {0};
  struct ran ran = {0};
  if (key && n == material.n && !memcmp(key, material.p, n) && code_current(dir, &r) && files_unchanged(&r) && mkdtemp(results_dir)) {
    if (!parse_plan(&r, results_dir, &p) || run_tool(p.argv, p.timeout_ms, &ran) != 0) {
      rmdir(results_dir);
    } else if (g_stop) {
      remove_results(results_dir, p.nresults);
      if (g_stop == SIGHUP) signal(SIGHUP, SIG_DFL), raise(SIGHUP);
      fprintf(stderr, "stopped by %s: every tool pyree_build started was ended\n", g_stop == SIGINT ? "SIGINT" : "SIGTERM");
      code = 128 + g_stop;
    } else {
      int same = !ran.timed_out && ran.status == 0 && ran.out.n == p.stdout_n && !memcmp(ran.out.p ? ran.out.p : "", p.stdout_, p.stdout_n);
      for (uint32_t k = 0; same && k < p.nresults; k++) {
        char file[PATH_MAX + 32];
        snprintf(file, sizeof file, "%s/result%u.npy", results_dir, k);
        same = same_bytes(file, p.results[k], p.result_n[k]);
      }
      code = !same ? hand_over(argc, argv, &ran, results_dir, path) /* returns only when it could not */
             : (lost = print_as_before(&p, ran.seconds)) ? output_lost(lost) : 0;
      char file[PATH_MAX + 32];
      snprintf(file, sizeof file, "%s/stdout", results_dir), unlink(file);
      snprintf(file, sizeof file, "%s/stderr", results_dir), unlink(file);
      remove_results(results_dir, p.nresults);
    }
  }
  free(data), free(material.p);
  return code;
}
