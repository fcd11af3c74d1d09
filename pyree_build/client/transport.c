/* The native pyree-build client: what CMake's actions and ctests run instead of a Python
 * start-up. It speaks client/protocol.py's protocol (read that module's docstring): passes
 * argv, cwd, umask, the environment and fds 0-2 to the per-user server, forwards SIGINT,
 * SIGTERM and SIGHUP, and exits with the command's code. With no server it starts one; when
 * none can be had (or PYREE_BUILD_SERVER=off) it execs the Python CLI in process. A `run`
 * command line that passed before and has a current plan (client/plans.py) it runs itself
 * (plan_runner.c).
 * Two builds of it: client/native.py's (CMake's build tree), with PYREE_PYTHON,
 * PYREE_IDENTITY, PYREE_BOOT and PYREE_PACKAGE (protocol's, of that Python) compiled in;
 * and the wheel's typed `pyree-build` (CMakeLists.txt, PYREE_TYPED_CLIENT), which learns them
 * at run time: the Python is the one pip wrote into the `pyree-build-py` console script beside
 * it, and the rest is asked of that Python once and kept in the socket directory. */
#include "client.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

static const char *PATH_ENV[] = {"PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE"};
static volatile sig_atomic_t g_sock = -1, g_last = 0;
const char *g_python, *g_identity, *g_boot, *g_package;
#ifdef PYREE_TYPED_CLIENT
static char g_script[PATH_MAX]; /* the Python console script beside this executable */
#endif

/* Run the command in process: the Python CLI with the server off. */
int in_process(int argc, char **argv, const char *why) {
  if (why) fprintf(stderr, "pyree_build: %s; running in this process\n", why);
  setenv("PYREE_BUILD_SERVER", "off", 1);
#ifdef PYREE_TYPED_CLIENT
  /* The Python client pip installed beside this one: it runs the CLI itself, the server off. */
  (void)argc;
  argv[0] = g_script;
  execv(g_script, argv);
  fprintf(stderr, "pyree_build: cannot run %s: %s\n", g_script, strerror(errno));
#else
  /* protocol.boot_argv("cli", ...): never `-m`, which imports from the caller's directory. */
  char **a = calloc((size_t)argc + 5, sizeof(char *));
  a[0] = (char *)g_python, a[1] = "-c", a[2] = (char *)g_boot, a[3] = (char *)g_package, a[4] = "cli";
  for (int i = 1; i < argc; i++) a[i + 4] = argv[i];
  execv(g_python, a);
  fprintf(stderr, "pyree_build: cannot run %s: %s\n", g_python, strerror(errno));
#endif
  return 127;
}

static uint32_t crc32(const char *s, size_t n) { /* zlib's CRC-32 */
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= (unsigned char)s[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

/* protocol.context(): this process's ids, groups, limits, capabilities, namespaces,
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

/* The socket directory (protocol.socket_dir), made 0700 if absent; 0 unless it is this
 * user's alone (protocol.check_dir). */
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

/* fnv over `h` and the PATH_ENV values, each after a NUL (protocol.socket_key). */
static uint64_t fnv_path_env(uint64_t h) {
  for (size_t i = 0; i < sizeof PATH_ENV / sizeof *PATH_ENV; i++) {
    const char *v = getenv(PATH_ENV[i]);
    h = fnv(h, "", 1);
    if (v) h = fnv(h, v, strlen(v));
  }
  return h;
}

/* The socket path (protocol.socket_path) in the checked directory `dir`; 0 if this
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
    "from pyree_build.client import protocol as p\n"
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
 * or unset: 0; anything else: -1, refused (protocol.enabled). */
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
 * [0-9.eE+-] only (protocol.idle_seconds: float() and strtod agree on such text). */
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
 * as the command's stdin or stdout (protocol.std_fds_open). */
static void std_fds_open(void) {
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0) {
      int null = open("/dev/null", O_RDWR);
      if (null >= 0 && null != fd) dup2(null, fd), close(null);
    }
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
