/* The native pyree-build client: what CMake's actions and ctests run instead of a Python
 * start-up. It speaks core/server_protocol.py's protocol (read that module's docstring): passes
 * argv, cwd, umask, the environment and fds 0-2 to the per-user server, forwards SIGINT,
 * SIGTERM and SIGHUP, and exits with the command's code. With no server it starts one; when
 * none can be had (or PYREE_BUILD_SERVER=off) it execs the Python CLI in process. A `run`
 * command line that passed before and has a current plan (core/client_plans.py) it runs itself.
 * Two builds of it: core/native_client.py's (CMake's build tree), with PYREE_PYTHON,
 * PYREE_IDENTITY, PYREE_BOOT and PYREE_PACKAGE (server_protocol's, of that Python) compiled in;
 * and the wheel's typed `pyree-build` (CMakeLists.txt, PYREE_TYPED_CLIENT), which learns them
 * at run time: the Python is the one pip wrote into the `pyree-build-py` console script beside
 * it, and the rest is asked of that Python once and kept in the socket directory. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every arch since Linux 5.3 */
#endif

extern char **environ;
static const char *PATH_ENV[] = {"PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE"};
static volatile sig_atomic_t g_sock = -1, g_last = 0;
/* server_protocol.boot_argv's Python, BOOT and package directory, and identity(). */
static const char *g_python, *g_identity, *g_boot, *g_package;
#ifdef PYREE_TYPED_CLIENT
static char g_script[PATH_MAX]; /* the Python console script beside this executable */
#endif

/* Run the command in process: the Python CLI with the server off. */
static int in_process(int argc, char **argv, const char *why) {
  if (why) fprintf(stderr, "pyree_build: %s; running in this process\n", why);
  setenv("PYREE_BUILD_SERVER", "off", 1);
#ifdef PYREE_TYPED_CLIENT
  /* The Python client pip installed beside this one: it runs the CLI itself, the server off. */
  (void)argc;
  argv[0] = g_script;
  execv(g_script, argv);
  fprintf(stderr, "pyree_build: cannot run %s: %s\n", g_script, strerror(errno));
#else
  /* server_protocol.boot_argv("cli", ...): never `-m`, which imports from the caller's directory. */
  char **a = calloc((size_t)argc + 5, sizeof(char *));
  a[0] = (char *)g_python, a[1] = "-c", a[2] = (char *)g_boot, a[3] = (char *)g_package, a[4] = "cli";
  for (int i = 1; i < argc; i++) a[i + 4] = argv[i];
  execv(g_python, a);
  fprintf(stderr, "pyree_build: cannot run %s: %s\n", g_python, strerror(errno));
#endif
  return 127;
}

static uint64_t fnv(uint64_t h, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001B3ULL;
  return h;
}

static uint32_t crc32(const char *s, size_t n) { /* zlib's CRC-32 */
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= (unsigned char)s[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

struct buf {
  char *p;
  size_t n, cap;
};

static void put(struct buf *b, const char *s, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 4096;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* A /proc file whole into `out` (NUL-terminated); its length, or -1 if it cannot be read. */
static ssize_t slurp(const char *path, char *out, size_t size) {
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

/* server_protocol.context(): this process's ids, groups, limits, capabilities, namespaces,
 * root... byte for byte as the Python function builds them; 0 when /proc cannot tell. */
static int context(struct buf *b) {
  static const char *status_fields[] = {"Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Cpus_allowed_list", "Mems_allowed_list"};
  static const char *files[] = {"limits", "cgroup", "oom_score_adj", "attr/current"};
  static const char *namespaces[] = {"cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts"};
  static char data[65536];
  char stat_text[4096], line[256];
  struct stat root;
  /* A /proc of another PID namespace (`unshare -p` without --mount-proc) numbers processes
   * otherwise: the server would look up another process by this one's SO_PEERCRED pid. */
  ssize_t k = readlink("/proc/self", line, sizeof line - 1);
  if (k < 0) return 0;
  line[k] = 0;
  if (strtol(line, NULL, 10) != (long)getpid()) return 0;
  if (slurp("/proc/self/stat", stat_text, sizeof stat_text) < 0 || stat("/proc/self/root", &root) != 0) return 0;
  ssize_t n = slurp("/proc/self/status", data, sizeof data);
  if (n < 0) return 0;
  /* nice, rt_priority, policy: fields 16, 37, 38 after the ")" ending the command's name */
  char *fields[40], *p = strrchr(stat_text, ')');
  p = p ? p + 1 : stat_text;
  int count = 0;
  for (char *tok = strtok(p, " \t\n\r\f\v"); tok && count < 40; tok = strtok(NULL, " \t\n\r\f\v")) fields[count++] = tok;
  if (count <= 38) return 0;
  for (char *start = data, *end; start <= data + n; start = end + 1) {
    end = memchr(start, '\n', (size_t)(data + n - start));
    if (!end) end = data + n;
    char *colon = memchr(start, ':', (size_t)(end - start));
    size_t key = colon ? (size_t)(colon - start) : (size_t)(end - start);
    for (size_t i = 0; i < sizeof status_fields / sizeof *status_fields; i++)
      if (strlen(status_fields[i]) == key && !strncmp(start, status_fields[i], key)) {
        put(b, start, (size_t)(end - start));
        puts_(b, "\n");
      }
  }
  snprintf(line, sizeof line, "sched %s %s %s\n", fields[16], fields[37], fields[38]);
  puts_(b, line);
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/%s", files[i]);
    n = slurp(path, data, sizeof data);
    puts_(b, files[i]), puts_(b, "\n");
    if (n < 0) puts_(b, "-");
    else put(b, data, (size_t)n);
    puts_(b, "\n");
  }
  for (size_t i = 0; i < sizeof namespaces / sizeof *namespaces; i++) {
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/self/ns/%s", namespaces[i]);
    k = readlink(path, link, sizeof link - 1);
    if (k < 0) strcpy(link, "-");
    else link[k] = 0;
    snprintf(line, sizeof line, "ns %s %s\n", namespaces[i], link);
    puts_(b, line);
  }
  snprintf(line, sizeof line, "root %llu:%llu\n", (unsigned long long)root.st_dev, (unsigned long long)root.st_ino);
  puts_(b, line);
  return 1;
}

/* The socket directory (server_protocol.socket_dir), made 0700 if absent; 0 unless it is this
 * user's alone (server_protocol.check_dir). */
static int socket_dir(char *dir, size_t size) {
  const char *rt = getenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (rt && rt[0] == '/' && strlen(rt) < 64 && stat(rt, &st) == 0 && S_ISDIR(st.st_mode))
    snprintf(dir, size, "%s/pyree_build", rt);
  else
    snprintf(dir, size, "/tmp/pyree_build-%u", (unsigned)getuid());
  mkdir(dir, 0700);
  return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() && !(st.st_mode & 077);
}

/* fnv over `h` and the PATH_ENV values, each after a NUL (server_protocol.socket_key). */
static uint64_t fnv_path_env(uint64_t h) {
  for (size_t i = 0; i < sizeof PATH_ENV / sizeof *PATH_ENV; i++) {
    const char *v = getenv(PATH_ENV[i]);
    h = fnv(h, "", 1);
    if (v) h = fnv(h, v, strlen(v));
  }
  return h;
}

/* The socket path (server_protocol.socket_path) in the checked directory `dir`; 0 if this
 * process's context cannot be read (no server can be shown to match it). */
static int socket_path(const char *dir, char *out, size_t size) {
  struct buf ctx = {0};
  if (!context(&ctx)) return 0;
  uint64_t h = fnv_path_env(fnv(0xCBF29CE484222325ULL, g_identity, strlen(g_identity)));
  uint32_t c = crc32(ctx.p, ctx.n);
  unsigned char le[5] = {0, c & 255, (c >> 8) & 255, (c >> 16) & 255, c >> 24};
  h = fnv(h, (const char *)le, sizeof le);
  free(ctx.p);
  snprintf(out, size, "%s/s-%016llx.sock", dir, (unsigned long long)h);
  return 1;
}

#ifdef PYREE_TYPED_CLIENT
/* The console script pip wrote beside this executable, and the Python in its first lines:
 * "#!PYTHON", or pip's form for paths with spaces: "#!/bin/sh", then a line "'''exec' "PYTHON" ...". */
static int script_python(char *python, size_t size) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 0;
  self[n] = 0;
  char *slash = strrchr(self, '/');
  if (!slash) return 0;
  *slash = 0;
  snprintf(g_script, sizeof g_script, "%s/pyree-build-py", self);
  FILE *f = fopen(g_script, "re");
  if (!f) return 0;
  char line[PATH_MAX + 32];
  int ok = 0;
  if (fgets(line, sizeof line, f) && !strncmp(line, "#!", 2)) {
    line[strcspn(line, "\r\n")] = 0;
    if (strcmp(line, "#!/bin/sh") != 0) {
      ok = line[2] == '/' && !strchr(line, ' ') && snprintf(python, size, "%s", line + 2) < (int)size;
    } else if (fgets(line, sizeof line, f) && !strncmp(line, "'''exec' \"", 10)) {
      char *end = strchr(line + 10, '"');
      ok = end && line[10] == '/' && (*end = 0, snprintf(python, size, "%s", line + 10) < (int)size);
    }
  }
  fclose(f);
  return ok;
}

/* What the console script's Python says of itself: identity, package directory, BOOT. */
static const char PROBE[] =
    "import sys\n"
    "if sys.path and sys.path[0] == '': del sys.path[0]\n"
    "from pyree_build.core import server_protocol as p\n"
    "sys.stdout.write('\\0'.join((p.identity(), p.boot_argv('', [])[3], p.BOOT, '')))\n";

/* Split "identity\0package\0boot\0" into the globals; 0 if malformed. */
static int take_config(char *text, size_t n) {
  char *field[3], *p = text, *end = text + n;
  for (int i = 0; i < 3; i++) {
    char *nul = memchr(p, 0, (size_t)(end - p));
    if (!nul || nul == p) return 0;
    field[i] = p, p = nul + 1;
  }
  g_identity = field[0], g_package = field[1], g_boot = field[2];
  return 1;
}

/* The typed client's configuration, kept in the socket directory under a name that changes
 * when the Python, the console script (a reinstall) or the import path variables change; asked
 * of that Python (~50 ms) only when absent. 0: run the Python client instead. */
static int typed_config(const char *dir, const char *python) {
  static char text[4 * PATH_MAX + 8192];
  struct stat st;
  if (stat(g_script, &st) != 0) return 0;
  g_python = python;
  uint64_t h = fnv(0xCBF29CE484222325ULL, python, strlen(python) + 1);
  h = fnv(h, g_script, strlen(g_script) + 1);
  long long stamp[3] = {(long long)st.st_ino, (long long)st.st_mtim.tv_sec, (long long)st.st_mtim.tv_nsec};
  h = fnv_path_env(fnv(h, (const char *)stamp, sizeof stamp));
  char conf[PATH_MAX], tmp[PATH_MAX + 32];
  snprintf(conf, sizeof conf, "%s/c-%016llx.conf", dir, (unsigned long long)h);
  int fd = open(conf, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    ssize_t n = read(fd, text, sizeof text);
    close(fd);
    if (n > 0 && take_config(text, (size_t)n)) return 1;
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return 0;
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0), dup2(out[1], 1);
    execl(python, python, "-c", PROBE, (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  size_t n = 0;
  while (pid > 0 && n < sizeof text) {
    ssize_t r = read(out[0], text + n, sizeof text - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(out[0]);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || n == sizeof text) return 0;
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", conf, (int)getpid());
  fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    int whole = write(fd, text, n) == (ssize_t)n;
    close(fd);
    if (!whole || rename(tmp, conf) != 0) unlink(tmp);
  }
  return take_config(text, n);
}
#endif

static uid_t g_peer_uid = (uid_t)-1;

/* A connection, once its peer credentials say this user's uid listens there (else -1 with
 * errno EPERM and g_peer_uid set): nothing is sent to anyone else. */
static int connect_to(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    int known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    if (known && cred.uid == geteuid()) return fd;
    if (known) g_peer_uid = cred.uid; /* else nothing is known of it: unusable, silently */
    close(fd);
    errno = EPERM;
    return -1;
  }
  int saved = errno;
  if (fd >= 0) close(fd);
  errno = saved;
  return -1;
}

static void path_with(char *out, size_t size, const char *sock, const char *suffix) {
  snprintf(out, size, "%.*s%s", (int)(strlen(sock) - 5), sock, suffix);
}

/* Start a server (its own session; fds 0-2 on /dev/null and its log) and wait until it listens. */
static int start_server(const char *path) {
  char log[PATH_MAX];
  path_with(log, sizeof log, path, ".log");
  unlink(path);
  pid_t pid = fork();
  if (pid == 0) {
    setsid();
    int in = open("/dev/null", O_RDONLY), out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(in, 0), dup2(out, 1), dup2(out, 2);
    for (int fd = 3; fd < 1024; fd++) close(fd);
    execl(g_python, g_python, "-c", g_boot, g_package, "server", "--socket", path, (char *)NULL);
    _exit(127);
  }
  if (pid < 0) return -1;
  for (int i = 0; i < 2000; i++) { /* 20 s */
    int fd = connect_to(path);
    if (fd >= 0) return fd;
    if (errno != ENOENT && errno != ECONNREFUSED) return -1;
    if (waitpid(pid, NULL, WNOHANG) == pid) return -1;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

/* A connection to the server, started if none answers (one client starts it: the lock). */
static int connect_or_start(const char *path) {
  int fd = connect_to(path);
  if (fd >= 0 || (errno != ENOENT && errno != ECONNREFUSED)) return fd;
  char lockpath[PATH_MAX];
  path_with(lockpath, sizeof lockpath, path, ".lock");
  int lock = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) != 0) return -1;
  fd = connect_to(path);
  if (fd < 0 && (errno == ENOENT || errno == ECONNREFUSED)) fd = start_server(path);
  close(lock);
  return fd;
}

/* The request frame: a 4-byte length, then NUL-terminated fields. */
static char *frame(int argc, char **argv, size_t *size) {
  char cwd[PATH_MAX], umask_text[16], argc_text[16];
  if (!getcwd(cwd, sizeof cwd)) return NULL;
  mode_t m = umask(022);
  umask(m);
  snprintf(umask_text, sizeof umask_text, "%o", (unsigned)m);
  snprintf(argc_text, sizeof argc_text, "%d", argc - 1);
  const char *head[] = {"pyree_build-server-1", "run", g_identity, cwd, umask_text, argc_text};
  size_t n = 4;
  for (int i = 0; i < 6; i++) n += strlen(head[i]) + 1;
  for (int i = 1; i < argc; i++) n += strlen(argv[i]) + 1;
  for (char **e = environ; *e; e++) n += strlen(*e) + 1;
  char *buf = malloc(n), *p = buf + 4;
  for (int i = 0; i < 6; i++) p = stpcpy(p, head[i]) + 1;
  for (int i = 1; i < argc; i++) p = stpcpy(p, argv[i]) + 1;
  for (char **e = environ; *e; e++) p = stpcpy(p, *e) + 1;
  uint32_t body = (uint32_t)(n - 4);
  unsigned char le[4] = {body & 255, (body >> 8) & 255, (body >> 16) & 255, body >> 24};
  memcpy(buf, le, 4);
  *size = n;
  return buf;
}

static int send_frame(int fd, const char *buf, size_t n) {
  int fds[3] = {0, 1, 2}; /* open, and none of them this socket: main() */
  char control[CMSG_SPACE(sizeof fds)] = {0};
  struct iovec iov = {(void *)buf, 4};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof fds);
  memcpy(CMSG_DATA(c), fds, sizeof fds);
  if (sendmsg(fd, &msg, MSG_NOSIGNAL) != 4) return -1;
  for (size_t off = 4; off < n;) {
    ssize_t w = send(fd, buf + off, n - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    off += (size_t)w;
  }
  return 0;
}

/* One reply line; "" when the server closed first. A signal (EINTR) does not end the wait. */
static void read_line(int fd, char *line, size_t size) {
  size_t n = 0;
  while (n + 1 < size) {
    ssize_t r = read(fd, line + n, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || line[n] == '\n') break;
    n++;
  }
  line[n] = 0;
}

static void forward(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  g_last = sig;
  if (g_sock >= 0) send(g_sock, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  errno = saved;
}

/* PYREE_BUILD_SERVER off, 0, no or false (any case, spaces around): 1; on, 1, yes, true, empty
 * or unset: 0; anything else: -1, refused (server_protocol.enabled). */
static int server_off(void) {
  const char *mode = getenv("PYREE_BUILD_SERVER");
  if (!mode) return 0;
  while (isspace((unsigned char)*mode)) mode++;
  size_t n = strlen(mode);
  while (n && isspace((unsigned char)mode[n - 1])) n--;
  static const char *off[] = {"off", "0", "no", "false"}, *on[] = {"on", "1", "yes", "true", ""};
  for (size_t i = 0; i < sizeof off / sizeof *off; i++)
    if (strlen(off[i]) == n && !strncasecmp(mode, off[i], n)) return 1;
  for (size_t i = 0; i < sizeof on / sizeof *on; i++)
    if (strlen(on[i]) == n && !strncasecmp(mode, on[i], n)) return 0;
  return -1;
}

/* $PYREE_BUILD_SERVER_IDLE: 1 if unset, empty, or seconds in (0, 604800] written with
 * [0-9.eE+-] only (server_protocol.idle_seconds: float() and strtod agree on such text). */
static int idle_ok(void) {
  const char *text = getenv("PYREE_BUILD_SERVER_IDLE");
  if (!text) return 1;
  while (isspace((unsigned char)*text)) text++;
  size_t n = strlen(text);
  while (n && isspace((unsigned char)text[n - 1])) n--;
  if (!n) return 1;
  char number[64];
  if (n >= sizeof number || strspn(text, "0123456789.eE+-") < n) return 0;
  memcpy(number, text, n), number[n] = 0;
  char *end;
  double v = strtod(number, &end);
  return end == number + n && v > 0 && v <= 604800.0;
}

/* Closed fds 0-2 become /dev/null before any socket is made: a socket there would be passed
 * as the command's stdin or stdout (server_protocol.std_fds_open). */
static void std_fds_open(void) {
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0) {
      int null = open("/dev/null", O_RDWR);
      if (null >= 0 && null != fd) dup2(null, fd), close(null);
    }
}

/* --- Runs of a plan (core/client_plans.py) -------------------------------------------
 * A `run` command line that passed before, written down with the stat of every file it read:
 * while all are unchanged, this client runs the tool itself and, when it exits 0 with the same
 * stdout and result bytes, prints what pyree_build printed then. Anything else is handed, as it
 * happened, to the Python CLI, which checks and reports it (PYREE_BUILD_RAN). */
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

/* client_plans.key_material: identity, cwd, the argument count and arguments, each ended by a
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
 * (client_plans.take_outcome): never run again, so a failure is never retried into a pass. */
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
static int run_plan(const char *dir, int argc, char **argv) {
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

int main(int argc, char **argv) {
  char dir[256], path[PATH_MAX], line[512];
  std_fds_open();
#ifdef PYREE_TYPED_CLIENT
  static char python[PATH_MAX];
  int have_python = script_python(python, sizeof python);
  if (!g_script[0] || access(g_script, X_OK) != 0) {
    fprintf(stderr, "pyree_build: no pyree-build-py beside this pyree-build (%s); reinstall pyree_build\n", g_script);
    return 127;
  }
#else
  g_python = PYREE_PYTHON, g_identity = PYREE_IDENTITY, g_boot = PYREE_BOOT, g_package = PYREE_PACKAGE;
#endif
  int off = server_off();
  if (off < 0) {
    fprintf(stderr, "error: PYREE_BUILD_SERVER=%s is neither on nor off\n"
                    "  fix: set it to on or off (1/0, yes/no, true/false), or unset it (on)\n", getenv("PYREE_BUILD_SERVER"));
    return 1;
  }
  if (off) return in_process(argc, argv, NULL);
  for (int i = 1; i < argc && i < 4; i++)
    if (!strcmp(argv[i], "server")) return in_process(argc, argv, NULL);
  if (!idle_ok()) {
    fprintf(stderr, "error: PYREE_BUILD_SERVER_IDLE=%s is not a number of seconds in (0, 604800]\n"
                    "  fix: unset it (the default is 900) or set a number of seconds in that range\n", getenv("PYREE_BUILD_SERVER_IDLE"));
    return 1;
  }
  if (!socket_dir(dir, sizeof dir)) return in_process(argc, argv, "not using the server: its directory is not this user's alone (mode 0700)");
#ifdef PYREE_TYPED_CLIENT
  if (!have_python || !typed_config(dir, python)) return in_process(argc, argv, NULL);
#endif
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "run")) {
      int code = run_plan(dir, argc, argv);
      if (code >= 0) return code;
      break;
    }
  if (!socket_path(dir, path, sizeof path)) return in_process(argc, argv, NULL);
  size_t n;
  char *buf = frame(argc, argv, &n);
  if (!buf) return in_process(argc, argv, NULL);
  struct sigaction sa = {.sa_handler = forward};
  for (int attempt = 0; attempt < 3; attempt++) {
    int fd = connect_or_start(path);
    if (fd < 0 && g_peer_uid != (uid_t)-1) {
      snprintf(line, sizeof line, "not using the server: %s is served by uid %u, not this user's (%u)", path, (unsigned)g_peer_uid, (unsigned)geteuid());
      return in_process(argc, argv, line);
    }
    if (fd < 0) return in_process(argc, argv, NULL);
    g_sock = fd;
    sigaction(SIGINT, &sa, NULL), sigaction(SIGTERM, &sa, NULL), sigaction(SIGHUP, &sa, NULL);
    if (send_frame(fd, buf, n) != 0) line[0] = 0;
    else read_line(fd, line, sizeof line);
    if (!strncmp(line, "refused", 7)) return in_process(argc, argv, line);
    if (!strncmp(line, "ok ", 3)) {
      read_line(fd, line, sizeof line);
      if (!strncmp(line, "exit ", 5)) return atoi(line + 5);
      fprintf(stderr, "pyree_build: the server's worker ended without an exit code (its log is beside %s)\n", path);
      return g_last ? 128 + g_last : 1;
    }
    g_sock = -1;
    close(fd); /* "stale" (that server exits; the next try starts a fresh one) or gone before it began */
  }
  return in_process(argc, argv, NULL);
}
