/*
 * tether-shell, native: the SHELL drop-in's one-command path, with no
 * interpreter in it (Linux).
 *
 * An agent CLI runs every tool call as `$SHELL -c CMD`; with SHELL pointing
 * here each command runs in the real shell inside a job of its own: this
 * process (the owner) forks the job's keeper, the keeper opens the job (a
 * cgroup, or a child subreaper) and starts the shell in it before its first
 * instruction, ends what the command leaves behind, and reports; the owner
 * writes the command's audit records and exits with its status (or dies by
 * its signal). This is the front end only: the keeper is oneshot.c's.
 *
 * Served here: `-c CMD [ARG0 ARG...]` in each form the Python parser takes
 * (-c, -lc, -l -c, --login -c, -c -l, -ic, -i -l -c, with - or --), TETHER_SHELL_MECHANISM
 * auto, cgroup or subreaper, TETHER_SHELL_SCOPE command or caller, the caller
 * watch, the log. Every other invocation - an interactive shell, a usage
 * error, no shell found, a log file only the audit module's rules can
 * judge - is handed over, before anything is done, to the
 * Python tether-shell installed beside this program (`tether-shell-py`), by
 * exec (same pid, same caller): its answer is the Python path's because it
 * is the Python path. The trap that rule avoids: two implementations of the
 * error cases, drifting apart.
 *
 * The job's keeper is tether-keeper's one-command driver (oneshot.c, which
 * keeper.c includes, and this file with it), forked here rather than exec'd:
 * its spawn into the cgroup with clone3, kill loops and cgroup removal are
 * the socket driver's. The Python tether-shell execs the same driver.
 */

#define TETHER_KEEPER_NO_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#include "keeper.c"

#include <limits.h>
#include <pwd.h>
#include <strings.h>
#include <sys/auxv.h>
#include <sys/random.h>
#include <sys/xattr.h>

/* the generated header's names (keeper.c includes it), shortened */
#define EXIT_USAGE TETHER_EXIT_USAGE
#define EXIT_GUARD_LOST TETHER_EXIT_GUARD_LOST
#define EXIT_INTERNAL TETHER_EXIT_INTERNAL
#define EXIT_NOEXEC TETHER_EXIT_NOEXEC
#define EXIT_NOT_FOUND TETHER_EXIT_NOT_FOUND
#define MAX_GRACE TETHER_MAX_GRACE
#define COOKIE_VAR TETHER_COOKIE_VAR
#define KEEPER_DIED "tether: keeper died; the job is no longer guarded"
#define FALLBACK_NAME "tether-shell-py"
#define RUN_FALLBACK_NAME "tether-py"
#define ARGV0_VAR "_TETHER_SHELL_ARGV0"

static char **g_argv;
static char self_exe[PATH_MAX];   /* this program, symlinks resolved */
static char argv0_path[PATH_MAX]; /* what the Python path calls sys.argv[0] */
static const char *fallback = FALLBACK_NAME; /* or RUN_FALLBACK_NAME: the tether CLI */
static int cli_front;                        /* started as `tether` */
static int dash_login; /* argv[0] began with '-': a login shell by name (login(1), sshd, su -) */
static const char *prog = "tether-shell";    /* who speaks in messages */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char text[8192];
    int n = snprintf(text, sizeof text, "%s: ", prog);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + n, sizeof text - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(text);
    text[len++] = '\n';
    ssize_t w = write(2, text, len);
    (void)w;
}

/* -- handing over to the Python tether-shell ------------------------------------ */

/* What watch_signals changed, put back before a hand-over: the Python path
 * (and its command) must start with the caller's signal state. */
static struct {
    int changed;
    sigset_t mask;
    int pipe_ign, chld_ign;
} S;

static void raw_signal_of(int sig, int ignored);

static void hand_over(void) __attribute__((noreturn));
static void hand_over(void)
{
    if (S.changed) {
        raw_signal_of(SIGPIPE, S.pipe_ign);
        raw_signal_of(SIGCHLD, S.chld_ign);
        sigprocmask(SIG_SETMASK, &S.mask, NULL);
    }
    static char *noargs[2];
    if (!g_argv[0]) /* argc == 0 */
        g_argv = noargs;
    char py[PATH_MAX + 32];
    snprintf(py, sizeof py, "%s", self_exe);
    char *slash = strrchr(py, '/');
    if (slash)
        snprintf(slash + 1, sizeof py - (size_t)(slash + 1 - py), "%s", fallback);
    /* the shell's installed name and recursion guard read sys.argv[0] (the
     * CLI reads nothing of it: the variable would reach its commands); "-"
     * in front: started as a login shell by name (the Python one's argv[0]
     * is the script's path, so it cannot see that itself) */
    char a0[PATH_MAX + 2];
    snprintf(a0, sizeof a0, "%s%s", dash_login ? "-" : "", argv0_path);
    if (cli_front || setenv(ARGV0_VAR, a0, 1) == 0) {
        g_argv[0] = py;
        execv(py, g_argv);
    }
    say("cannot hand this invocation to the Python %s (%s: %s); reinstall tether", prog, py,
        strerror(errno));
    _exit(EXIT_INTERNAL);
}

/* -- small file and path helpers ------------------------------------------------- */

static int is_exe_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* os.path.join(d, name) for an absolute d */
static void join(char *out, size_t size, const char *d, const char *name)
{
    size_t l = strlen(d);
    if ((size_t)snprintf(out, size, "%s%s%s", d, l && d[l - 1] == '/' ? "" : "/", name) >= size)
        out[0] = '\0'; /* too long to be a path: names nothing */
}

/* -- is a path tether-shell itself (the rules of _shellargs.SelfCheck) -------------- */

struct self_id {
    dev_t dev;
    ino_t ino;
    off_t size;
    const char *path;
};
static struct self_id selves[2];
static int nselves;

static void self_add(const char *p)
{
    struct stat st;
    if (p[0] && stat(p, &st) == 0 && S_ISREG(st.st_mode) && nselves < 2)
        selves[nselves++] = (struct self_id){st.st_dev, st.st_ino, st.st_size, p};
}

static int has_marker(const char *buf, size_t n)
{
    static const char *const marks[] = {"tether.shell", "tether-shell", "tether shell"};
    for (size_t m = 0; m < 3; m++)
        if (memmem(buf, n, marks[m], strlen(marks[m])))
            return 1;
    return 0;
}

/* The first and last 4 KiB (a launcher puts its script at one end). */
static int file_marked(const char *path)
{
    int fd = openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    static char buf[8192];
    ssize_t head = read(fd, buf, 4096);
    struct stat st;
    ssize_t tail = 0;
    if (head > 0 && fstat(fd, &st) == 0) {
        if (st.st_size > 2 * 4096 && lseek(fd, st.st_size - 4096, SEEK_SET) < 0)
            tail = -1;
        if (tail == 0)
            tail = read(fd, buf + head, 4096);
    }
    close(fd);
    if (head < 0)
        return 0;
    return has_marker(buf, (size_t)head + (size_t)(tail > 0 ? tail : 0));
}

static int same_bytes(const char *a, const char *b)
{
    int fa = openat(AT_FDCWD, a, O_RDONLY | O_CLOEXEC), fb = fa < 0 ? -1 : openat(AT_FDCWD, b, O_RDONLY | O_CLOEXEC);
    int same = fa >= 0 && fb >= 0;
    static char ba[65536], bb[65536];
    while (same) {
        ssize_t na = read(fa, ba, sizeof ba), nb = read(fb, bb, sizeof bb);
        if (na != nb || na < 0 || memcmp(ba, bb, (size_t)na) != 0)
            same = 0;
        else if (na == 0)
            break;
    }
    if (fa >= 0)
        close(fa);
    if (fb >= 0)
        close(fb);
    return same;
}

static int is_self(const char *cand)
{
    static const char *const names[] = {"tether-shell", "tether-shell.exe", "tether-cmd",
                                        "tether-cmd.exe"};
    char low[256];
    snprintf(low, sizeof low, "%s", base_name(cand));
    for (char *c = low; *c; c++)
        if (*c >= 'A' && *c <= 'Z')
            *c = (char)(*c - 'A' + 'a');
    for (size_t k = 0; k < 4; k++)
        if (strcmp(low, names[k]) == 0)
            return 1;
    struct stat st;
    int have = stat(cand, &st) == 0;
    for (int k = 0; have && k < nselves; k++)
        if (selves[k].dev == st.st_dev && selves[k].ino == st.st_ino)
            return 1;
    if (file_marked(cand))
        return 1;
    for (int k = 0; have && k < nselves; k++)
        if (selves[k].size == st.st_size && same_bytes(selves[k].path, cand))
            return 1;
    return 0;
}

/* -- finding the real shell (_shellargs.resolve; any doubt: hand over) ------------ */

static const char *path_env(void);

/* A copy of PATH to cut into entries (PATH has no length limit). */
static char *path_copy(void)
{
    char *buf = strdup(path_env());
    if (!buf)
        hand_over();
    return buf;
}

static int which_in(char *out, size_t size, const char *name)
{
    char *buf = path_copy();
    int found = 0;
    for (char *d = buf, *next; d && !found; d = next) {
        next = strchr(d, ':');
        if (next)
            *next++ = '\0';
        if (d[0] != '/')
            continue; /* empty or relative: it would depend on the command's cwd */
        join(out, size, d, name);
        found = is_exe_file(out);
    }
    free(buf);
    return found;
}

static int not_a_shell(const char *path)
{
    static const char *const no[] = {"nologin", "false", "true", "sync", "halt", "shutdown"};
    for (size_t k = 0; k < 6; k++)
        if (strcmp(base_name(path), no[k]) == 0)
            return 1;
    return 0;
}

static const char *path_env(void)
{
    const char *p = getenv("PATH");
    return p ? p : "/bin:/usr/bin"; /* os.defpath */
}

static void find_after(char *out, size_t size, const char *name, const char *dir)
{
    char real[PATH_MAX], rd[PATH_MAX];
    if (!realpath(dir, real))
        snprintf(real, sizeof real, "%s", dir);
    char *buf = path_copy();
    /* the entries after dir's (all of PATH when it is not on it) */
    char *start = buf;
    for (char *d = buf, *next; d; d = next) {
        next = strchr(d, ':');
        char keep = next ? *next : 0;
        if (next)
            *next = '\0';
        if (d[0] == '/' && realpath(d, rd) && strcmp(rd, real) == 0) {
            start = next ? next + 1 : NULL;
            if (next)
                *next = keep;
            break;
        }
        if (next)
            *next++ = keep;
    }
    for (char *d = start, *next; d; d = next) {
        next = strchr(d, ':');
        if (next)
            *next++ = '\0';
        if (d[0] != '/')
            continue;
        join(out, size, d, name);
        if (is_exe_file(out) && !is_self(out)) {
            free(buf);
            return;
        }
    }
    hand_over(); /* no real shell of that name: the Python path says so */
}

static void resolve_shell(char *out, size_t size)
{
    const char *v = getenv("TETHER_SHELL");
    if (v && *v) {
        if (v[0] != '/' || !is_exe_file(v) || is_self(v))
            hand_over(); /* its error message is the Python path's */
        snprintf(out, size, "%s", v);
        return;
    }
    const char *name = base_name(argv0_path);
    if (!strcmp(name, "bash") || !strcmp(name, "zsh") || !strcmp(name, "sh")) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)(name - argv0_path), argv0_path);
        find_after(out, size, name, dir[0] ? dir : ".");
        return;
    }
    struct passwd *pw = getpwuid(getuid());
    const char *login = pw && pw->pw_shell && pw->pw_shell[0] ? pw->pw_shell : NULL;
    char bash[PATH_MAX];
    for (int k = 0; k < 3; k++) {
        /* PATH is searched only when the login shell will not do */
        const char *c = k == 0 ? login : k == 2 ? "/bin/sh"
                        : which_in(bash, sizeof bash, "bash") ? bash : NULL;
        if (!c || c[0] != '/' || not_a_shell(c) || !is_exe_file(c) || is_self(c))
            continue;
        snprintf(out, size, "%s", c);
        return;
    }
    hand_over();
}

/* -- TETHER_* settings: a value only the Python rules can judge is handed over ------ */

static int env_bool(const char *name, int dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char low[8];
    size_t n = strlen(v);
    if (n >= sizeof low)
        hand_over();
    for (size_t k = 0; k <= n; k++)
        low[k] = (char)(v[k] >= 'A' && v[k] <= 'Z' ? v[k] - 'A' + 'a' : v[k]);
    if (!strcmp(low, "1") || !strcmp(low, "on") || !strcmp(low, "yes") || !strcmp(low, "true"))
        return 1;
    if (!strcmp(low, "0") || !strcmp(low, "off") || !strcmp(low, "no") || !strcmp(low, "false"))
        return 0;
    hand_over();
}

static long long env_count(const char *name, long long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    size_t n = strlen(v);
    if (n > 15 || strspn(v, "0123456789") != n)
        hand_over();
    long long x = strtoll(v, NULL, 10);
    if (x <= 0)
        hand_over();
    return x;
}

/* Seconds by ending.check_grace's rules (0 to 3600), in the plain decimal
 * form only: anything Python's float() reads otherwise is handed over. */
static double parse_grace(const char *v)
{
    size_t n = strlen(v), ints = strspn(v, "0123456789");
    size_t frac = v[ints] == '.' ? strspn(v + ints + 1, "0123456789") : 0;
    size_t used = ints + (v[ints] == '.' ? 1 + frac : 0);
    if (used != n || (ints == 0 && frac == 0) || n > 32)
        hand_over();
    double g = strtod(v, NULL);
    if (!(g >= 0 && g <= MAX_GRACE))
        hand_over();
    return g;
}

static double env_grace(void)
{
    const char *v = getenv("TETHER_SHELL_GRACE");
    return !v || !*v ? TETHER_SHELL_GRACE : parse_grace(v);
}

/* -- the audit log (tether.shell_log.ShellLog: ordinary records in audit.jsonl) ------- */

/* This front end only appends: one write() of whole lines on an O_APPEND fd,
 * under the checks tether.audit applies. Rotation, carry and pruning are the
 * Python writer's (tether.audit.AuditWriter): whenever one may be due - the
 * live file near its rotation size, no prune for PRUNE_EVERY (the lock
 * file's mtime) - or a check fails, the start is handed over. */
#define AUDIT_FILE TETHER_AUDIT_FILE
#define AUDIT_LOCK TETHER_AUDIT_FILE ".lock"
#define PRUNE_EVERY TETHER_AUDIT_PRUNE_EVERY
#define START_ROOM TETHER_SHELL_LOG_START_ROOM /* > a start's and an exit's records */
#define ACL_XATTR "system.posix_acl_access"

static struct {
    int on;
    char dir[PATH_MAX];
    int fd;
    long long max;
    long long days;
} L = {.fd = -1};

static int safe_dir(const struct stat *st)
{
    return S_ISDIR(st->st_mode) && st->st_uid == geteuid() && !(st->st_mode & 022);
}

static int mkdirs(const char *dir)
{
    char p[PATH_MAX];
    if (!dir[0] || (size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p)
        return -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0777) < 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    return mkdir(p, 0700) < 0 && errno != EEXIST ? -1 : 0;
}

static void log_dir(void)
{
    const char *v = getenv("TETHER_STATE_DIR");
    if (v && *v) {
        if (v[0] != '/')
            hand_over(); /* '~': expanduser's rules; relative: the Python one's usage error */
        if ((size_t)snprintf(L.dir, sizeof L.dir, "%s", v) >= sizeof L.dir)
            L.on = 0; /* longer than a path may be: no log, as open() would say */
        return;
    }
    v = getenv("XDG_STATE_HOME");
    if (v && v[0] == '/') {
        join(L.dir, sizeof L.dir, v, "tether");
        if (!L.dir[0])
            L.on = 0;
        return;
    }
    const char *home = getenv("HOME");
    if (!home) {
        struct passwd *pw = getpwuid(getuid());
        if (!pw || !pw->pw_dir) {
            L.on = 0; /* no home directory at all: no log */
            return;
        }
        home = pw->pw_dir;
    }
    if (!*home)
        hand_over();
    size_t l = strlen(home);
    while (l > 0 && home[l - 1] == '/')
        l--;
    if ((size_t)snprintf(L.dir, sizeof L.dir, "%.*s/.local/state/tether", (int)l, home) >=
        sizeof L.dir)
        L.on = 0;
}

/* The last prune (the lock file's mtime) is recent, or the lock file is new
 * (nothing rotated yet): else the Python writer is due to prune. */
static int pruned_lately(int dfd)
{
    struct stat st;
    if (fstatat(dfd, AUDIT_LOCK, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT)
            return 0;
        int lk = openat(dfd, AUDIT_LOCK, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK |
                        O_CLOEXEC, 0600);
        if (lk >= 0)
            close(lk);
        return lk >= 0 || errno == EEXIST;
    }
    time_t now = time(NULL);
    return S_ISREG(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022) &&
           st.st_mtime <= now && now - st.st_mtime < PRUNE_EVERY;
}

/* A regular file of ours that no one else can write by its mode
 * (tether.audit.file_refusal's rule; an ACL is left to it to judge). */
static int ours_only(const struct stat *st)
{
    return S_ISREG(st->st_mode) && st->st_uid == geteuid() && !(st->st_mode & 022);
}

/* Open the live audit file to append, turn the log off (a directory that
 * cannot be made or is unsafe: as the Python writer does), or hand over. */
static void log_open(void)
{
    struct stat st;
    if (lstat(L.dir, &st) < 0) {
        if (errno != ENOENT || mkdirs(L.dir) < 0 || lstat(L.dir, &st) < 0) {
            L.on = 0;
            return;
        }
    }
    if (!safe_dir(&st)) {
        L.on = 0;
        return;
    }
    int dfd = open(L.dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 || fstat(dfd, &st) < 0 || !safe_dir(&st) ||
        fgetxattr(dfd, ACL_XATTR, NULL, 0) >= 0 || !pruned_lately(dfd))
        hand_over(); /* a swapped directory, an ACL, a prune due: the audit writer's */
    /* O_NONBLOCK: a FIFO planted there never blocks (ENXIO without a reader) */
    L.fd = openat(dfd, AUDIT_FILE,
                  O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    close(dfd);
    if (L.fd < 0 || fstat(L.fd, &st) < 0 || !ours_only(&st)) {
        /* a link, a FIFO, no access, another's or others-writable: the audit
         * writer could not use it either - the log is off for this command */
        if (L.fd >= 0)
            close(L.fd);
        L.fd = -1;
        L.on = 0;
        return;
    }
    if (fgetxattr(L.fd, ACL_XATTR, NULL, 0) >= 0 ||
        (st.st_size > 0 && st.st_size + START_ROOM > L.max))
        hand_over(); /* an ACL to judge, or a rotation due: the audit writer's */
}

/* A JSON record, built in one buffer: only numbers, fixed words, ids and
 * paths - never command text, arguments or environment values. */
static struct {
    char b[16384];
    size_t n;
} J;

static void jraw(const char *s)
{
    size_t l = strlen(s);
    if (J.n + l < sizeof J.b) {
        memcpy(J.b + J.n, s, l);
        J.n += l;
    }
}

static void jf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void jf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(J.b + J.n, sizeof J.b - J.n, fmt, ap);
    va_end(ap);
    if (n > 0 && J.n + (size_t)n < sizeof J.b)
        J.n += (size_t)n;
}

/* A string as tether.shell_log._json_str writes the str Python decoded
 * (surrogateescape: an undecodable byte is the lone surrogate U+DC80+b). */
static void jstr(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), chars = 0;
    jraw("\"");
    for (size_t k = 0; k < n && chars < 1024; chars++) {
        size_t len = utf8_seq(p + k, n - k);
        if (len == 0) {
            jf("\\u%04x", 0xDC00 + p[k]);
            k++;
        } else if (len > 1) {
            char seq[5] = {0};
            memcpy(seq, p + k, len);
            jraw(seq);
            k += len;
        } else if (p[k] == '"' || p[k] == '\\') {
            jf("\\%c", p[k]);
            k++;
        } else if (p[k] < 0x20 || p[k] == 0x7F) {
            jf("\\u%04x", p[k]);
            k++;
        } else {
            char c[2] = {(char)p[k], 0};
            jraw(c);
            k++;
        }
    }
    jraw("\"");
}

/* An identity as the audit log writes it: {"pid": N, "start": "ticks@bootid"} */
static void jident(const char *key, pid_t pid, unsigned long long start)
{
    if (pid > 0 && start && K.boot[0])
        jf(",\"%s\":{\"pid\":%d,\"start\":\"%llu@%s\"}", key, (int)pid, start, K.boot);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Seconds as Python's repr(round(t, 3)) writes them: no trailing zeros. */
static void jtime(void)
{
    char t[40];
    snprintf(t, sizeof t, "%.3f", wall_now());
    size_t n = strlen(t);
    while (n > 2 && t[n - 1] == '0' && t[n - 2] != '.')
        t[--n] = '\0';
    jraw(t);
}

/* A record's first fields; jend closes it. Several records go in one write. */
static void jhead(const char *event, const char *mechanism)
{
    jraw("{\"v\":1,\"ts\":");
    jtime();
    jf(",\"event\":\"%s\",\"app\":\"tether-shell\",\"wrapper\":%d", event, (int)getpid());
    if (mechanism) {
        jraw(",\"mechanism\":");
        jstr(mechanism);
    }
}

static void jend(void)
{
    jraw("}\n");
}

/* The records jhead..jend built: one write, then the buffer is empty again. */
static void log_write(void)
{
    if (L.on && L.fd >= 0 && J.n < sizeof J.b - 1 && write(L.fd, J.b, J.n) < 0)
        L.on = 0;
    J.n = 0;
}

/* errno.errorcode's name for err (glibc's, but where Python's table differs) */
static const char *errname(int err)
{
    static char buf[16];
    if (err == EDEADLK)
        return "EDEADLOCK";
    if (err == EOPNOTSUPP)
        return "ENOTSUP";
    if (err > 132) { /* beyond Python's table (EHWPOISON...) */
        snprintf(buf, sizeof buf, "E%d", err);
        return buf;
    }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    const char *n = strerrorname_np(err);
    if (n)
        return n;
#endif
    snprintf(buf, sizeof buf, "E%d", err);
    return buf;
}

/* -- the owner: this process ------------------------------------------------------- */

struct outcome {
    pid_t child, keeper;
    unsigned long long child_start, keeper_start;
    char mechanism[16];
    char cgroup[4096];
    int status; /* raw wait status, -1 none */
    long long leftovers;
    int stopped_by;
    int ended_by_caller;
    int lingers; /* scope caller: the keeper stays with what the command left */
    int keeper_died;
    int reported;
    char fail_kind[8];
    int fail_err;
    char fail_text[4200];
};


static void raw_signal_of(int sig, int ignored)
{
    raw_signal(sig, ignored ? SIG_IGN : SIG_DFL);
}

/* The kernel's raw sigaction, which also answers for glibc's own 32 and 33. */
static int raw_ignored(int sig)
{
    struct {
        void (*handler)(int);
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } old;
    if (syscall(SYS_rt_sigaction, sig, NULL, &old, sizeof(uint64_t)) < 0)
        return 0;
    return old.handler == SIG_IGN;
}

static void die_by(int sig) __attribute__((noreturn));
static void die_by(int sig)
{
    static const int core[] = {SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV,
                               SIGXCPU, SIGXFSZ, SIGSYS};
    for (size_t k = 0; k < sizeof core / sizeof *core; k++)
        if (core[k] == sig) {
            struct rlimit no = {0, 0}; /* no core file of the wrapper for the command's crash */
            setrlimit(RLIMIT_CORE, &no);
        }
    if (sig > 0 && sig < 65 && sig != SIGKILL && sig != SIGSTOP)
        raw_signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    _exit(128 + sig);
}

/* The keeper vanished while the command ran: end the job from here. */
static void end_from_here(struct run *R, struct outcome *o)
{
    end_without_keeper(o->cgroup, R->mount, R->cookie, R->born);
}

/* The keeper died before it reported the command: it may have started it.
 * What it would have made is known: the job's cgroup, and its cookie. */
static void end_unreported(struct run *R, struct outcome *o)
{
    int n = !R->want_cgroup ? -1
            : R->scope_caller /* (oneshot.c's open_cgroup names them) */
                ? snprintf(o->cgroup, sizeof o->cgroup, "%s/tether-%d-%llu/%s/%s", R->base,
                           (int)R->caller, R->caller_start, TETHER_SHELL_SCOPE_DIR, R->job_id)
                : snprintf(o->cgroup, sizeof o->cgroup, "%s/tether-%d-%llu/%s", R->base,
                           (int)R->owner, R->owner_start, R->job_id);
    if (n < 0 || (size_t)n >= sizeof o->cgroup)
        o->cgroup[0] = '\0';
    end_from_here(R, o);
    if (o->cgroup[0] && rmdir(o->cgroup) == 0) /* the keeper's to remove; it cannot now */
        rmdir_run_dir_of(o->cgroup);
    o->cgroup[0] = '\0';
}

/* -- the steps both fronts take ------------------------------------------------------ */

static void find_self(char **argv)
{
    g_argv = argv;
    ssize_t sl = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    self_exe[sl > 0 ? sl : 0] = '\0';
}

/* The shell's: the path we were started through, and what is "self" to the
 * recursion guard. */
static void find_argv0(void)
{
    /* sys.argv[0] of the Python path: the path we were started through - the
     * file execve was given (for a script the kernel hands the interpreter
     * exactly that), made absolute */
    const char *fn = (const char *)getauxval(AT_EXECFN);
    if (!fn || !*fn)
        fn = self_exe;
    if (fn[0] == '/' || !getcwd(argv0_path, sizeof argv0_path)) {
        if ((size_t)snprintf(argv0_path, sizeof argv0_path, "%s", fn) >= sizeof argv0_path)
            hand_over();
    } else {
        size_t l = strlen(argv0_path);
        if ((size_t)snprintf(argv0_path + l, sizeof argv0_path - l, "/%s",
                             fn[0] == '.' && fn[1] == '/' ? fn + 2 : fn) >= sizeof argv0_path - l)
            hand_over();
    }
    self_add(argv0_path);
    self_add(self_exe);
}

/* A cgroup extended attribute's value, blanks trimmed: 1 when it is there. */
static int unit_mark(const char *dir, const char *name, char *val, size_t size)
{
    ssize_t n = getxattr(dir, name, val, size - 1);
    if (n < 0)
        return 0;
    while (n > 0 && (val[n - 1] == '\n' || val[n - 1] == ' '))
        n--;
    val[n] = '\0';
    return 1;
}

/* systemd's rule - only a unit started with Delegate=yes may be divided - as
 * tether.systemd.delegation decided it for our unit and left it on the
 * unit's cgroup (TETHER_DELEGATION_MEMO: "yes"/"no", or ":UID" after it when
 * it holds for that user only). 1 yes, 0 no. A unit with no answer for us
 * yet is the Python path's: it decides (systemctl at most once per unit)
 * and leaves the answer, so the rules exist once and later starts are ours.
 * A new unit of the same name is a new directory: decided again. */
static int systemd_delegated(const struct run *R)
{
    char udir[4096], val[64];
    size_t m = strlen(R->mount);
    snprintf(udir, sizeof udir, "%s", R->base);
    for (;;) { /* the innermost .service or .scope at or above our cgroup */
        if (strlen(udir) <= m)
            return 0; /* in no unit: systemd's, not ours */
        const char *name = strrchr(udir, '/') + 1;
        size_t k = strlen(name);
        if ((k > 8 && !strcmp(name + k - 8, ".service")) || (k > 6 && !strcmp(name + k - 6, ".scope")))
            break;
        *strrchr(udir, '/') = '\0';
    }
    if (unit_mark(udir, TETHER_DELEGATION_MEMO, val, sizeof val)) {
        char *uid = strchr(val, ':');
        if (uid) {
            *uid++ = '\0';
            char *end;
            unsigned long who = strtoul(uid, &end, 10);
            if (*end || end == uid || who != (unsigned long)geteuid())
                hand_over(); /* another user's answer */
        }
        if (!strcmp(val, "yes"))
            return 1;
        if (!strcmp(val, "no"))
            return 0;
    }
    hand_over();
}

/* Where a cgroup job may go: our own cgroup's directory, when writable
 * (cgroupfs.base_dir); none: a subreaper for auto, else hand over. */
static void find_cgroup_base(struct run *R)
{
    static char mi[65536], cg[8192];
    char *m = NULL, *rel = NULL;
    if (read_file("/proc/self/mountinfo", mi, sizeof mi) > 0)
        for (char *ln = mi, *nx; ln && *ln; ln = nx) {
            nx = strchr(ln, '\n');
            if (nx)
                *nx++ = '\0';
            char *sep = strstr(ln, " - ");
            if (!sep || strncmp(sep + 3, "cgroup2 ", 8))
                continue;
            char *f = ln; /* the fifth field: the mount point */
            for (int k = 0; k < 4 && f; k++) {
                f = strchr(f, ' ');
                if (f)
                    f++;
            }
            if (f) {
                char *e = strchr(f, ' ');
                if (e)
                    *e = '\0';
                m = f;
            }
            break;
        }
    if (m && read_file("/proc/self/cgroup", cg, sizeof cg) > 0)
        for (char *ln = cg, *nx; ln && *ln; ln = nx) {
            nx = strchr(ln, '\n');
            if (nx)
                *nx++ = '\0';
            if (!strncmp(ln, "0::", 3)) {
                rel = ln + 3;
                break;
            }
        }
    if (m && strchr(m, '\\'))
        hand_over(); /* an escaped mount point: mountinfo's rules */
    int usable = 0;
    if (m && rel) {
        size_t cut = (size_t)snprintf(R->mount, sizeof R->mount, "%s", m) >= sizeof R->mount;
        if (!strcmp(rel, "/") || !*rel)
            cut |= (size_t)snprintf(R->base, sizeof R->base, "%s", m) >= sizeof R->base;
        else
            cut |= (size_t)snprintf(R->base, sizeof R->base, "%s/%s", m,
                                    rel[0] == '/' ? rel + 1 : rel) >= sizeof R->base;
        if (cut)
            hand_over(); /* longer than a path may be: the Python path's errors */
        char probe[4200], procs[4200];
        snprintf(probe, sizeof probe, "%s/cgroup.procs", R->mount);
        snprintf(procs, sizeof procs, "%s/cgroup.procs", R->base);
        usable = access(probe, F_OK) == 0 && access(R->base, W_OK) == 0 &&
                 access(procs, W_OK) == 0;
        struct stat sd;
        if (usable && stat("/run/systemd/system", &sd) == 0 && S_ISDIR(sd.st_mode))
            usable = systemd_delegated(R);
    }
    if (!usable) {
        if (!R->mech_auto)
            hand_over(); /* the Python path says why there is no cgroup */
        R->want_cgroup = 0;
    }
}

/* The caller: watched by pidfd from the start (oneshot.watch_caller's rules). */
static void watch_caller(struct run *R)
{
    R->callerfd = -1;
    pid_t pp = getppid();
    if (pp <= 1)
        return;
    int fd = pidfd_open_(pp);
    if (fd < 0)
        return;
    pid_t sid = getsid(0);
    if (sid != getpid() && getsid(pp) != sid) {
        close(fd); /* an orphan adopted at start: not our caller */
        return;
    }
    R->caller_start = proc_stat(pp, NULL, NULL);
    if (!R->caller_start || getppid() != pp) {
        close(fd); /* died while we looked: the pidfd may name a reuser of its pid */
        return;
    }
    R->callerfd = fd;
    R->caller = pp;
}

/* The signals this front waits for, blocked and read from a signalfd; one
 * the caller left ignored stays ignored (nohup, a background job). */
static int watch_signals(struct run *R, const int *sigs, size_t n)
{
    sigprocmask(SIG_SETMASK, NULL, &R->orig_mask);
    for (int s = 1; s < 65; s++)
        R->orig_ign[s] = (unsigned char)raw_ignored(s);
    S.mask = R->orig_mask;
    S.pipe_ign = R->orig_ign[SIGPIPE];
    S.chld_ign = R->orig_ign[SIGCHLD];
    S.changed = 1;
    /* a reader gone from stderr, or the keeper from its pipe, must not kill
     * us (the command still gets SIGPIPE default); and our children are
     * ours to wait for, even under a caller that ignores SIGCHLD */
    raw_signal(SIGPIPE, SIG_IGN);
    raw_signal(SIGCHLD, SIG_DFL);
    sigset_t watch;
    sigemptyset(&watch);
    for (size_t k = 0; k < n; k++)
        if (!R->orig_ign[sigs[k]])
            sigaddset(&watch, sigs[k]);
    sigprocmask(SIG_BLOCK, &watch, NULL);
    return signalfd(-1, &watch, SFD_NONBLOCK | SFD_CLOEXEC);
}

/* The job's names and cookie, and the environment with the cookie first (a
 * forged one replaced); the owner's pidfd. */
static char **name_the_job(struct run *R)
{
    R->owner = getpid();
    R->owner_start = proc_stat(0, NULL, NULL);
    R->pgid = getpgrp();
    R->ownerfd = pidfd_open_(R->owner);
    if (R->ownerfd < 0)
        hand_over(); /* a kernel older than 5.3: the Python path's generic job */
    if (R->scope_caller) { /* one run per caller: it is over when the caller is */
        snprintf(R->run_id, sizeof R->run_id, "%d-%llu", (int)R->caller, R->caller_start);
        snprintf(R->job_id, sizeof R->job_id, "s%d-%llu", (int)R->owner, R->owner_start);
    } else {
        snprintf(R->run_id, sizeof R->run_id, "%d-%llu", (int)R->owner, R->owner_start);
        snprintf(R->job_id, sizeof R->job_id, "j%d-1", (int)R->owner);
    }
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        hand_over();
    snprintf(R->cookie, sizeof R->cookie, "%s:%s:%02x%02x%02x%02x%02x%02x%02x%02x", R->run_id,
             R->job_id, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    extern char **environ;
    size_t ne = 0;
    while (environ[ne])
        ne++;
    char **envp = calloc(ne + 2, sizeof *envp);
    static char entry[240];
    if (!envp)
        hand_over();
    snprintf(entry, sizeof entry, "%s=%s", COOKIE_VAR, R->cookie);
    size_t k2 = 0;
    envp[k2++] = entry;
    for (size_t k = 0; k < ne; k++)
        if (strncmp(environ[k], COOKIE_VAR "=", sizeof COOKIE_VAR) != 0 && strchr(environ[k], '='))
            envp[k2++] = environ[k];
    envp[k2] = NULL;
    return envp;
}

/* Fork the keeper (it never returns here); its pid, or -1 (errno set). A
 * signal already waiting means we were interrupted before the command
 * existed: nothing runs, and we die by it (as a shell would, and as an
 * unblocked signal would have ended us). */
static pid_t start_keeper(struct run *R, char **envp, int sigfd, int *rep_r, int *ctl_w)
{
    struct signalfd_siginfo si;
    if (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si)
        die_by((int)si.ssi_signo);
    int rep[2], ctl[2];
    if (pipe2(rep, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(ctl, O_CLOEXEC) < 0) {
        int err = errno;
        close(rep[0]);
        close(rep[1]);
        errno = err;
        return -1;
    }
    R->born = now_ticks(); /* nothing of the job is older */
    pid_t keeper = fork();
    if (keeper < 0) {
        int err = errno;
        close(rep[0]);
        close(rep[1]);
        close(ctl[0]);
        close(ctl[1]);
        errno = err;
        return -1;
    }
    if (keeper == 0) {
        close(sigfd);
        close(rep[0]);
        close(ctl[1]);
        if (L.fd >= 0)
            close(L.fd);
        keeper_begin(R, envp, rep[1], ctl[0]);
    }
    close(rep[1]);
    close(ctl[0]);
    close(R->ownerfd);
    if (R->callerfd >= 0)
        close(R->callerfd);
    if (R->lifefd >= 0)
        close(R->lifefd); /* the keeper's to watch; the command never had it */
    *rep_r = rep[0];
    *ctl_w = ctl[1];
    return keeper;
}

/* Wait for the keeper's reports (P, then X or E) and for our own signals:
 * stop(si) says whether a signal stops the job (the keeper is told: "s").
 * on_start runs once the command runs. */
static void wait_reports(struct outcome *o, int rep_r, int ctl_w, int sigfd,
                         int (*stop)(const struct signalfd_siginfo *), void (*on_start)(struct outcome *))
{
    struct pollfd p[2] = {{rep_r, POLLIN, 0}, {sigfd, POLLIN, 0}};
    static char buf[16384];
    size_t have = 0;
    int done = 0;
    while (!done) {
        if (poll_fds(p, 2) < 0) {
            o->keeper_died = 1;
            break;
        }
        if (p[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
                if (stop(&si) && !o->stopped_by) {
                    o->stopped_by = (int)si.ssi_signo;
                    ssize_t w = write(ctl_w, "s", 1); /* the keeper gone: EOF follows */
                    (void)w;
                }
            }
        }
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        ssize_t n = read(rep_r, buf + have, sizeof buf - 1 - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            o->keeper_died = 1; /* EOF without a report: its end of the pipe was its alone */
            break;
        }
        have += (size_t)n;
        buf[have] = '\0';
        char *line = buf, *nl;
        while (!done && (nl = strchr(line, '\n'))) {
            *nl = '\0';
            if (line[0] == 'P') {
                int ch = 0, off = 0;
                char mw[16] = "";
                if (sscanf(line, "P %d %15s %llu %n", &ch, mw, &o->child_start, &off) >= 3 && off) {
                    o->child = ch;
                    snprintf(o->mechanism, sizeof o->mechanism, "%s", mw);
                    if (strcmp(line + off, "-") != 0)
                        snprintf(o->cgroup, sizeof o->cgroup, "%s", line + off);
                    o->keeper_start = proc_stat(o->keeper, NULL, NULL); /* ours: readable until reaped */
                    if (on_start)
                        on_start(o);
                }
            } else if (line[0] == 'X') {
                int st = -1;
                long long left = 0;
                char tail[16] = "";
                sscanf(line, "X %d %lld %15s", &st, &left, tail);
                o->status = st;
                o->leftovers = left;
                o->ended_by_caller = strcmp(tail, "caller") == 0;
                o->lingers = strcmp(tail, "linger") == 0;
                o->reported = 1;
                done = 1;
            } else if (line[0] == 'E') {
                int err = 0, off = 0;
                char kind[8] = "";
                if (sscanf(line, "E %7s %d %n", kind, &err, &off) >= 2) {
                    snprintf(o->fail_kind, sizeof o->fail_kind, "%s", kind);
                    o->fail_err = err;
                    snprintf(o->fail_text, sizeof o->fail_text, "%s", off ? line + off : "");
                }
                done = 1;
            }
            line = nl + 1;
        }
        have = strlen(line);
        memmove(buf, line, have + 1);
    }
    close(rep_r);
    close(ctl_w);
}

static void reap_keeper(pid_t keeper)
{
    while (waitpid(keeper, NULL, 0) < 0 && errno == EINTR) {
    }
}

/* -- tether-shell ------------------------------------------------------------------ */

static struct run R;
static int shell_login, shell_argc;

static int shell_stop(const struct signalfd_siginfo *si)
{
    /* SIGINT/SIGQUIT are the command's: it shares our process group */
    return si->ssi_signo == SIGTERM || si->ssi_signo == SIGHUP;
}

/* run, job, and the command's identity (pid, "ticks@bootid") */
static void jjob(pid_t child, unsigned long long start)
{
    jf(",\"run\":\"%s\",\"job\":\"%s\"", R.run_id, R.job_id);
    if (child > 0)
        jf(",\"pid\":%d", (int)child);
    if (child > 0 && start && K.boot[0])
        jf(",\"start\":\"%llu@%s\"", start, K.boot);
}

/* A command's start: job-open and spawn, as tether.shell_log.ShellLog writes them. */
static void shell_started(struct outcome *o)
{
    if (!L.on)
        return;
    jhead("job-open", o->mechanism);
    jjob(0, 0);
    jraw(",\"name\":");
    jstr(R.scope_caller ? TETHER_SHELL_SCOPE_JOB : TETHER_SHELL_JOB);
    jraw(R.scope_caller ? ",\"scope\":\"caller\"" : ",\"scope\":\"command\"");
    if (R.scope_caller) /* the job is the caller's: it owns it */
        jident("owner", R.caller, R.caller_start);
    else
        jident("owner", R.owner, R.owner_start);
    jident("keeper", o->keeper, o->keeper_start);
    if (R.caller)
        jident("caller", R.caller, R.caller_start);
    jraw(",\"cookie\":");
    jstr(R.cookie);
    if (o->cgroup[0]) {
        jraw(",\"cgroup\":");
        jstr(o->cgroup);
    }
    jf(",\"parent\":%d,\"mode\":\"shell\",\"argc\":%d,\"login\":%s", (int)getppid(),
       shell_argc, shell_login ? "true" : "false");
    jend();
    if (o->child > 0) {
        jhead("spawn", o->mechanism);
        jjob(o->child, o->child_start);
        jraw(",\"boot\":");
        jstr(K.boot);
        jraw(",\"in_job\":true");
        if (o->cgroup[0]) {
            jraw(",\"cgroup\":");
            jstr(o->cgroup);
        }
        jend();
    }
    log_write();
}

/* A command that did not start: one error record (err: a fixed code). */
static void log_error(const char *err, const char *mechanism)
{
    if (!L.on)
        return;
    jhead("error", mechanism);
    jraw(",\"error\":");
    jstr(err);
    jf(",\"parent\":%d,\"mode\":\"shell\"", (int)getppid());
    jend();
    log_write();
}

/* A command's end: exit (status: the code, or minus the signal) and job-close. */
static void log_exit(const struct outcome *o, double ms)
{
    if (!L.on || o->child <= 0)
        return;
    const char *mech = o->mechanism[0] ? o->mechanism : NULL;
    int st = o->status;
    jhead("exit", mech);
    jjob(o->child, o->child_start);
    if (st < 0)
        jf(",\"error\":\"%s\"", o->keeper_died ? "keeper-died" : "no-status");
    else
        jf(",\"status\":%d", WIFSIGNALED(st) ? -WTERMSIG(st) : WEXITSTATUS(st));
    jf(",\"leftovers\":%lld,\"ms\":%.1f", o->leftovers, ms);
    if (o->stopped_by)
        jf(",\"stopped_by\":%d", o->stopped_by);
    if (o->ended_by_caller)
        jraw(",\"ended_by\":\"caller\"");
    jend();
    /* A command's job is over when it returned; in scope caller only if it
     * left nothing (what it left ends with the caller). */
    if (!R.scope_caller || o->leftovers == 0) {
        jhead("job-close", mech);
        jjob(0, 0);
        jf(",\"leftovers\":%lld", o->leftovers);
        jend();
    }
    log_write();
}

static int shell_main(int argc, char **argv)
{
    double t0 = now_s();
    /* the forms of _shellargs._parse_shell that run a command, with the
     * POSIX set options (_shellargs.SET_LETTERS, -o NAME, + forms) kept for
     * the real shell, one per word; more than fit here: the Python one */
    static char letter[64][3];
    char *opts[64];
    int nopt = 0;
    int login = 0, saw_c = 0, saw_i = 0, i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--") || !strcmp(a, "-")) {
            i++;
            break;
        }
        if (!strcmp(a, "--login"))
            login = 1;
        else if (a[0] == '-' && a[1] == '-')
            hand_over();
        else if ((a[0] == '-' || a[0] == '+') && a[1]) {
            for (const char *c = a + 1; *c; c++) {
                if (a[0] == '-' && *c == 'c')
                    saw_c = 1;
                else if (a[0] == '-' && *c == 'l')
                    login = 1;
                else if (a[0] == '-' && *c == 'i')
                    saw_i = 1;
                else if ((*c && strchr("abCefhmnuvx", *c)) || *c == 'o') {
                    if (nopt + 2 > 64 || (*c == 'o' && i + 1 >= argc))
                        hand_over(); /* -o without its name: the usage error */
                    letter[nopt][0] = a[0];
                    letter[nopt][1] = *c;
                    opts[nopt] = letter[nopt];
                    nopt++;
                    if (*c == 'o')
                        opts[nopt++] = argv[++i];
                } else
                    hand_over();
            }
        } else
            break;
    }
    if (!saw_c || i >= argc)
        hand_over(); /* an interactive shell, or a usage error */
    int cmd_at = i;
    login |= dash_login;

    shell_login = login;
    shell_argc = argc - 1;

    /* the settings, as tether.shell.cli reads them */
    const char *mech = getenv("TETHER_SHELL_MECHANISM");
    if (!mech || !*mech || !strcmp(mech, "auto"))
        R.mech_auto = R.want_cgroup = 1;
    else if (!strcmp(mech, "cgroup"))
        R.want_cgroup = 1;
    else if (strcmp(mech, "subreaper"))
        hand_over();
    const char *mech_word = !mech || !*mech ? "auto" : mech;
    R.grace = env_grace();
    int with_caller = env_bool("TETHER_SHELL_WITH_CALLER", 1);
    const char *scope = getenv("TETHER_SHELL_SCOPE");
    int scope_caller = scope && !strcmp(scope, "caller");
    /* (scope caller with the caller not watched is a usage error: the Python
     * one says it) */
    if (scope && *scope && strcmp(scope, "command") && !(scope_caller && with_caller))
        hand_over();
    L.on = env_bool("TETHER_SHELL_LOG", 1);
    L.days = env_count("TETHER_SHELL_LOG_DAYS", 14);
    L.max = env_count("TETHER_SHELL_LOG_MAX_BYTES", TETHER_AUDIT_MAX_BYTES);
    resolve_shell(R.shell, sizeof R.shell);
    {
        /* PowerShell or cmd.exe as the real shell (_shellargs.shell_flavour):
         * its own argv, and set options refused - the Python one's */
        const char *base = strrchr(R.shell, '/');
        base = base ? base + 1 : R.shell;
        size_t bl = strlen(base);
        if (bl > 4 && !strcasecmp(base + bl - 4, ".exe"))
            bl -= 4;
        if ((bl == 4 && !strncasecmp(base, "pwsh", 4)) ||
            (bl == 10 && !strncasecmp(base, "powershell", 10)) ||
            (bl == 3 && !strncasecmp(base, "cmd", 3)))
            hand_over();
    }
    if (R.want_cgroup)
        find_cgroup_base(&R);
    if (L.on) {
        log_dir();
        if (L.on)
            log_open();
    }
    R.callerfd = -1;
    R.lifefd = -1;
    if (with_caller)
        watch_caller(&R);
    R.scope_caller = scope_caller && R.callerfd >= 0; /* no caller watched: scope command */
    /* what the command leaves behind (`sleep 60 & exit`) is re-parented to
     * us, not to PID 1, until the job ends it, whatever the mechanism (only
     * open_subreaper sets it otherwise; as `tether run` does; our waits name
     * their pids) */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    static const int watched[] = {SIGTERM, SIGHUP, SIGINT, SIGQUIT};
    int sigfd = watch_signals(&R, watched, 4);
    if (sigfd < 0)
        hand_over();
    char **envp = name_the_job(&R);
    if (L.on && read_file("/proc/sys/kernel/random/boot_id", K.boot, sizeof K.boot) > 0) {
        char *nl = strchr(K.boot, '\n'); /* the records' boot: what start ticks count from */
        if (nl)
            *nl = '\0';
    }

    /* the shell's argv: [shell, (-l), (-i), OPTIONS..., -c, (--), CMD, ARG0, ...]
     * (_shellargs.shell_argv): -i with -c is OMP's `$SHELL -i -c CMD` for zsh
     * and fish users; "--" before a CMD the real shell would read as an option */
    char **sargv = calloc((size_t)(argc - cmd_at + nopt) + 6, sizeof *sargv);
    if (!sargv)
        hand_over();
    size_t na = 0;
    sargv[na++] = R.shell;
    if (login)
        sargv[na++] = "-l";
    if (saw_i)
        sargv[na++] = "-i";
    for (int k = 0; k < nopt; k++)
        sargv[na++] = opts[k];
    sargv[na++] = "-c";
    if (argv[cmd_at][0] == '-' || argv[cmd_at][0] == '+')
        sargv[na++] = "--";
    for (int k = cmd_at; k < argc; k++)
        sargv[na++] = argv[k];
    sargv[na] = NULL;
    R.argv = sargv;
    static char *nopath[] = {NULL};
    R.path = nopath;

    struct outcome o = {.status = -1};
    int rep_r, ctl_w;
    pid_t keeper = start_keeper(&R, envp, sigfd, &rep_r, &ctl_w);
    if (keeper < 0) {
        say("cannot create a job, nothing was run: cannot start the job's keeper: %s",
            strerror(errno));
        log_error("job-refused", mech_word);
        return EXIT_INTERNAL;
    }
    o.keeper = keeper;
    wait_reports(&o, rep_r, ctl_w, sigfd, shell_stop, shell_started);
    if (o.keeper_died && o.child && !o.reported) {
        ssize_t w = write(2, KEEPER_DIED "\n", sizeof KEEPER_DIED);
        (void)w;
        end_from_here(&R, &o);
    } else if (o.keeper_died && !o.child) {
        end_unreported(&R, &o); /* it may have started the command unreported */
    }
    if (!o.lingers) /* (one that stays is re-parented once we exit) */
        reap_keeper(keeper);
    if (o.fail_kind[0]) {
        if (!strcmp(o.fail_kind, "exec")) {
            say("%s: %s", R.shell, strerror(o.fail_err));
            log_error(errname(o.fail_err), mech_word);
            return o.fail_err == ENOENT ? EXIT_NOT_FOUND : EXIT_NOEXEC;
        }
        say("cannot create a job, nothing was run: %s", o.fail_text[0] ? o.fail_text : strerror(o.fail_err));
        log_error("job-refused", mech_word);
        return EXIT_INTERNAL;
    }
    if (!o.child && o.stopped_by)
        die_by(o.stopped_by); /* interrupted before the command existed: nothing ran */
    if (!o.child && o.keeper_died) {
        say("the job's keeper died before the command started; nothing was run");
        return EXIT_INTERNAL;
    }
    int st = o.status;
    int rc_known = st >= 0;
    int sig = rc_known && WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    int code = rc_known && WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    log_exit(&o, (now_s() - t0) * 1000.0);
    if (o.stopped_by)
        die_by(o.stopped_by);
    if (!rc_known) {
        if (!o.keeper_died)
            say("the command's exit status was lost with the job's keeper");
        return EXIT_GUARD_LOST;
    }
    if (sig)
        die_by(sig);
    return code;
}

/* -- tether run -- CMD ---------------------------------------------------------------- */

static int run_stop(const struct signalfd_siginfo *si)
{
    if (si->ssi_signo == SIGQUIT)
        return 0;
    /* a Ctrl+C typed at the terminal reached the command too: it decides */
    return !(si->ssi_signo == SIGINT && si->ssi_code == SI_KERNEL);
}

/* The keeper died while the command ran: the command is ours now (we are
 * a child subreaper), so its own status can still be had - wait for it
 * (a stop signal is passed on to it), then end what is left from here. */
static int wait_orphaned_command(struct outcome *o, int sigfd, double grace)
{
    /* Ours only if it is our child now (alive or a zombie): a pid the keeper
     * reaped before it died may name someone else already. */
    siginfo_t si0;
    memset(&si0, 0, sizeof si0);
    if (waitid(P_PID, (id_t)o->child, &si0, WEXITED | WNOHANG | WNOWAIT) < 0)
        return -1; /* reaped by the keeper before it died: the status went with it */
    int fd = pidfd_open_(o->child); /* our unreaped child: the pid cannot be reused */
    double kill_at = 0; /* after a stop: SIGKILL once the grace is over */
    while (fd >= 0) {
        int timeout = -1;
        if (kill_at > 0) {
            double left = kill_at - now_s();
            timeout = left > 0 ? (int)(left * 1000) + 1 : 0;
        }
        struct pollfd p[2] = {{fd, POLLIN, 0}, {sigfd, POLLIN, 0}};
        int n = poll(p, 2, timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (p[0].revents & POLLIN)
            break;
        struct signalfd_siginfo si;
        while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si)
            if (run_stop(&si) && !o->stopped_by) {
                o->stopped_by = (int)si.ssi_signo;
                pidfd_signal_(fd, SIGTERM);
                pidfd_signal_(fd, SIGCONT);
                kill_at = now_s() + grace;
            }
        if (kill_at > 0 && now_s() >= kill_at) {
            pidfd_signal_(fd, SIGKILL);
            kill_at = 0;
        }
    }
    if (fd >= 0)
        close(fd);
    int st = -1;
    while (waitpid(o->child, &st, 0) < 0) {
        if (errno != EINTR)
            return -1;
    }
    return st;
}

/* --lifeline FD: an open pipe or socket above stdio (what the command gets
 * is 0-2 only, and the keeper's own 0-2 are /dev/null); the same words as
 * runner.check_lifeline. */
static int open_lifeline(const char *arg, struct run *r)
{
    char *end = NULL;
    errno = 0;
    long fd = strtol(arg, &end, 10);
    struct stat st;
    if (errno || !*arg || *end || fd < 3 || fd > INT_MAX) {
        say("--lifeline %s: expected a file descriptor number of 3 or more; nothing was run", arg);
        return -1;
    }
    if (fstat((int)fd, &st) < 0) {
        say("--lifeline %s: not an open file descriptor; nothing was run", arg);
        return -1;
    }
    if (!S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode)) {
        say("--lifeline %s: not a pipe or socket; nothing was run", arg);
        return -1;
    }
    r->lifefd = (int)fd;
    return 0;
}

static int run_main(int argc, char **argv)
{
    /* tether run [-m auto|cgroup|subreaper] [--grace S] [--] CMD [ARG...]; every
     * other option (and the audit log: TETHER_STATE_DIR) is the Python CLI's */
    const char *mech = NULL;
    const char *lifeline = NULL;
    int with_parent = 0;
    int i = 2;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-')
            break;
        if (!strcmp(a, "-m") || !strcmp(a, "--mechanism")) {
            if (++i >= argc)
                hand_over();
            mech = argv[i];
        } else if (!strncmp(a, "--mechanism=", 12)) {
            mech = a + 12;
        } else if (!strcmp(a, "--grace")) {
            if (++i >= argc)
                hand_over();
            R.grace = parse_grace(argv[i]);
        } else if (!strncmp(a, "--grace=", 8)) {
            R.grace = parse_grace(a + 8);
        } else if (!strcmp(a, "--die-with-parent")) {
            with_parent = 1;
        } else if (!strcmp(a, "--lifeline")) {
            if (++i >= argc)
                hand_over();
            lifeline = argv[i];
        } else if (!strncmp(a, "--lifeline=", 11)) {
            lifeline = a + 11;
        } else {
            hand_over();
        }
    }
    if (i >= argc || strlen(argv[i]) >= sizeof R.shell)
        hand_over(); /* no command: the Python CLI's usage message */
    const char *sd = getenv("TETHER_STATE_DIR");
    if (sd && *sd)
        hand_over(); /* the spawn audit log is the Python writer's */
    if (!mech || !strcmp(mech, "auto"))
        R.mech_auto = R.want_cgroup = 1;
    else if (!strcmp(mech, "cgroup"))
        R.want_cgroup = 1;
    else if (strcmp(mech, "subreaper"))
        hand_over();
    if (R.want_cgroup)
        find_cgroup_base(&R);
    L.on = 0; /* tether-shell's log is not tether run's */
    R.callerfd = -1;
    R.lifefd = -1;
    if (lifeline && open_lifeline(lifeline, &R) < 0)
        return EXIT_INTERNAL;
    if (with_parent) {
        watch_caller(&R); /* tether-shell's caller watch: the same rules */
        if (R.callerfd < 0) {
            say("--die-with-parent: the process that started tether run is already gone; nothing was run");
            return EXIT_INTERNAL;
        }
    }
    /* should the keeper die, the command is re-parented to us: its status stays ours */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    static const int watched[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    int sigfd = watch_signals(&R, watched, 4);
    if (sigfd < 0)
        hand_over();
    char **envp = name_the_job(&R);
    snprintf(R.shell, sizeof R.shell, "%s", argv[i]);
    R.argv = argv + i;
    R.only_stdio = 1;
    R.cli = 1;
    /* the command is searched for on PATH as execvp does (os.get_exec_path) */
    char *pathbuf = path_copy();
    size_t nd = 1;
    for (const char *c = pathbuf; *c; c++)
        nd += *c == ':';
    char **dirs = calloc(nd + 1, sizeof *dirs);
    if (!dirs)
        hand_over();
    size_t k = 0;
    for (char *d = pathbuf, *next; d; d = next) {
        next = strchr(d, ':');
        if (next)
            *next++ = '\0';
        dirs[k++] = d;
    }
    dirs[k] = NULL;
    R.path = dirs;

    struct outcome o = {.status = -1};
    int rep_r, ctl_w;
    pid_t keeper = start_keeper(&R, envp, sigfd, &rep_r, &ctl_w);
    if (keeper < 0) {
        say("cannot create the job: cannot start the job's keeper: %s", strerror(errno));
        return EXIT_INTERNAL;
    }
    o.keeper = keeper;
    wait_reports(&o, rep_r, ctl_w, sigfd, run_stop, NULL);
    reap_keeper(keeper);
    if (o.keeper_died && o.child && !o.reported) {
        ssize_t w = write(2, KEEPER_DIED "\n", sizeof KEEPER_DIED);
        (void)w;
        o.status = wait_orphaned_command(&o, sigfd, R.grace);
        end_from_here(&R, &o);
    } else if (o.keeper_died && !o.child) {
        end_unreported(&R, &o); /* it may have started the command unreported */
    }
    const char *cmd = argv[i];
    if (o.fail_kind[0]) {
        int e = o.fail_err;
        if (!strcmp(o.fail_kind, "spawn")) {
            say("%s", o.fail_text); /* runner.py's words for a refused spawn */
            return EXIT_INTERNAL;
        }
        if (strcmp(o.fail_kind, "exec")) {
            say("cannot create the job: %s", o.fail_text[0] ? o.fail_text : strerror(e));
            return EXIT_INTERNAL;
        }
        if (e == ENOENT) {
            say("%s: command not found", cmd);
            return EXIT_NOT_FOUND;
        }
        if (e == EACCES || e == EPERM) {
            say("%s: permission denied", cmd);
            return EXIT_NOEXEC;
        }
        if (e == ENOEXEC) {
            say("%s: cannot execute: %s", cmd, strerror(e));
            return EXIT_NOEXEC;
        }
        say("cannot start %s: [Errno %d] %s: '%s'", cmd, e, strerror(e), cmd);
        return EXIT_INTERNAL;
    }
    if (!o.child) {
        if (o.stopped_by)
            return 128 + o.stopped_by;
        say("cannot create the job: its keeper died before the command started");
        return EXIT_INTERNAL;
    }
    if (o.stopped_by)
        return 128 + o.stopped_by;
    if (o.status < 0) {
        say("the command's exit status was lost with its keeper");
        return EXIT_GUARD_LOST;
    }
    if (WIFSIGNALED(o.status))
        return 128 + WTERMSIG(o.status);
    return WEXITSTATUS(o.status);
}

/* A caller may start us with stdin, stdout or stderr closed. The first file,
 * pipe or pidfd we open would then take that number, and be taken for the
 * command's stdio (its stdin a log file) or lost under the keeper's own
 * /dev/null stdio (a caller's pidfd read as always ready: the caller "dead",
 * the command SIGKILLed). So a closed one holds /dev/null from the start,
 * close-on-exec: the command (and a hand-over's Python) still finds it
 * closed, as the caller left it. */
static void hold_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int null = openat(AT_FDCWD, "/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0 && null != fd) { /* (cannot be: fd is the lowest free one) */
            dup3(null, fd, O_CLOEXEC);
            close(null);
        }
    }
}

int main(int argc, char **argv)
{
    hold_std_fds();
    find_self(argv);
    if (!strcmp(base_name(argc > 0 && argv[0] ? argv[0] : ""), "tether")) {
        /* the tether CLI: `run` served here, the rest by the Python CLI */
        fallback = RUN_FALLBACK_NAME;
        cli_front = 1;
        prog = "tether";
        R.grace = TETHER_DEFAULT_GRACE;
        if (argc >= 2 && !strcmp(argv[1], "run"))
            return run_main(argc, argv);
        hand_over();
    }
    dash_login = argc > 0 && argv[0] && argv[0][0] == '-';
    find_argv0(); /* before any hand-over: the Python one is told it */
    return shell_main(argc, argv);
}
