/*
 * tether-keeper: the native keeper of one tether job (Linux), the one
 * keeper of the cgroup, subreaper and pidns mechanisms there (pgroup, the
 * mechanism of macOS and the BSDs, has a Python keeper of its own). A small
 * C process instead of an interpreter: it creates nothing the owner did not
 * ask for, starts each child inside the job before the child's first
 * instruction, watches the owner by pidfd (and, told earlier, by the owner's
 * beacon: beacon_wait) and ends the whole job the moment the owner is gone.
 *
 *   tether-keeper serve MECH CTL_FD OWNER_PID OWNER_PIDFD [cgroup=PATH mount=PATH]
 *                 [background=1] [legacy=1] [owner_state=0] [beacon=FD:OFFSET]
 *                 [keep=FD,...]
 *   tether-keeper pin KEEPER_PID      (a job's pin, started by its keeper: pin_job)
 *   tether-keeper one ...             (one command in a job of its own: oneshot.c)
 *
 * legacy=1 makes it behave as on a kernel without clone3, cgroup.kill and
 * PIDFD_GET_INFO (fork and move in by hand; freeze and kill each member;
 * read a process's parent from /proc), so the tests
 * can run those paths on a kernel that has both; owner_state=0 makes it
 * answer as if it could not read the owner's /proc (the owner then sends
 * its state itself), for the tests of that path.
 *
 * MECH is cgroup, subreaper or pidns (the process-group mechanism stays in
 * Python: it needs the table capture). The owner talks to it over CTL_FD, a
 * SOCK_STREAM unix socket, in the protocol docs/protocol.md specifies for
 * every client (Python's Job is one, a Node host another): one frame is a
 * 4-byte big-endian length and a CBOR map, with file descriptors in
 * SCM_RIGHTS on its first bytes; a payload too big for a frame travels in a
 * memfd ({"_memfd": size} + the fd).
 *
 * Mechanisms, and their traps:
 *  - cgroup: each child is cloned straight into the job's cgroup
 *    (clone3 with CLONE_INTO_CGROUP | CLONE_PIDFD, Linux >= 5.7), so this
 *    keeper never moves itself into the job: no cgroup move, no RCU wait, on
 *    any spawn, and cgroup.kill never hits the keeper. Without clone3 the
 *    child moves itself in before exec.
 *  - subreaper: PR_SET_CHILD_SUBREAPER; ending is a kill loop over
 *    /proc/self/task/<tid>/children (not atomic: rescan after each round of
 *    reaping, never after each single reap; never walk the dying again: what
 *    they forked comes down to us) until waitpid says ECHILD.
 *  - pidns: unshare(CLONE_NEWPID [| CLONE_NEWUSER]) in this process, then one
 *    fork: the child is the namespace's init and the keeper; the intermediate
 *    reports the init's outer pid and exits (after unshare, later forks of
 *    the intermediate would land in the namespace, and fail once its init
 *    is gone). When the init exits, the kernel kills the whole namespace.
 *
 * Every fd is close-on-exec; children get exactly the fds the owner mapped.
 * Signals: the keeper blocks hang-up, interrupt, terminate and job control
 * (a caller killing the owner's group must not take it along); a child gets
 * the owner's ignored signals as SIG_IGN and every other one as SIG_DFL -
 * glibc's internal 32 and 33 included, set with the raw system call.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <linux/futex.h>
#include <linux/sched.h>
#include <sched.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif

/* the shared constants: a header setup.py generates (their one definition is
 * tether/_constants.py); nothing here writes their values again */
#include "tether_constants.h"

#define MAX_MSG TETHER_MAX_MSG /* largest frame body */
#define MAX_FDS TETHER_MAX_FDS
#define MAX_CHILDREN 65536
#define KILL_BOUND TETHER_KILL_BOUND
/* the child cgroup of a job that holds its pin */
#define PIN_DIR TETHER_PIN_DIR

/* ------------------------------------------------------------------------ */
/* small helpers                                                            */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int pidfd_open_(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

static int pidfd_signal_(int fd, int sig)
{
    return (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
}

/* Files are opened with openat(AT_FDCWD, ...), never open(): musl's open()
 * follows O_CLOEXEC with an fcntl(F_SETFD) (for kernels before 2.6.23), a
 * system call more per file, and a walk of /proc opens one per process. */
static int write_file(const char *path, const char *text)
{
    int fd = openat(AT_FDCWD, path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    int err = errno;
    close(fd);
    errno = err;
    return n < 0 ? -1 : 0;
}

/* Read a whole small file (path relative to dir) into buf, NUL-terminated;
 * bytes read, or -1. */
static ssize_t read_file_at(int dir, const char *path, char *buf, size_t size)
{
    int fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got + 1 < size) {
        ssize_t n = read(fd, buf + got, size - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}

static ssize_t read_file(const char *path, char *buf, size_t size)
{
    return read_file_at(AT_FDCWD, path, buf, size);
}

/* Field n of a /proc/PID/stat line, as proc(5) numbers them (3 the state,
 * 4 the parent, 9 the flags, 22 the start), or NULL: counted from the
 * comm's last ')', as a comm may hold spaces and parentheses. */
static const char *stat_field(const char *line, int n)
{
    const char *q = strrchr(line, ')');
    for (int k = 2; q && k < n; k++)
        q = strchr(q + 1, ' ');
    return q && q[1] ? q + 1 : NULL;
}

/* One entry of getdents64 (glibc's readdir would bring stdio's DIR along). */
struct dent64 {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
};

/* The one walk over a directory's entries:
 *     struct dir_walk w;
 *     if (dir_open(&w, path) == 0) { const struct dent64 *d;
 *         while ((d = dir_next(&w))) ...; close(w.fd); } */
struct dir_walk {
    int fd;
    long got, off;
    char buf[4096] __attribute__((aligned(8)));
};

static int dir_open_at(struct dir_walk *w, int dir, const char *path)
{
    w->got = w->off = 0;
    w->fd = openat(dir, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return w->fd < 0 ? -1 : 0;
}

static int dir_open(struct dir_walk *w, const char *path)
{
    return dir_open_at(w, AT_FDCWD, path);
}

static const struct dent64 *dir_next(struct dir_walk *w)
{
    if (w->off >= w->got) {
        w->got = syscall(SYS_getdents64, w->fd, w->buf, sizeof w->buf);
        w->off = 0;
        if (w->got <= 0)
            return NULL;
    }
    const struct dent64 *d = (const void *)(w->buf + w->off);
    w->off += d->reclen;
    return d;
}

/* ------------------------------------------------------------------------ */
/* the wire: CBOR (RFC 8949), the subset docs/protocol.md lists             */

enum vtype { V_NONE, V_BOOL, V_INT, V_FLOAT, V_BYTES, V_STR, V_LIST, V_DICT };

typedef struct value value;
struct value {
    enum vtype t;
    int64_t i;          /* V_INT, V_BOOL */
    double f;           /* V_FLOAT */
    const char *s;      /* V_BYTES, V_STR: not NUL-terminated */
    size_t len;         /* bytes of s, or items of a list/dict */
    value **items;      /* V_LIST: len items; V_DICT: 2*len (key, value) */
};

typedef struct {
    const unsigned char *p, *end;
    char *arena;        /* every value of one message */
    size_t used, cap;
    int bad;
} reader;

static void *arena_alloc(reader *r, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (r->used + n > r->cap) {
        r->bad = 1;
        return NULL;
    }
    void *p = r->arena + r->used;
    r->used += n;
    return p;
}

static value *new_value(reader *r, enum vtype t)
{
    value *v = arena_alloc(r, sizeof(value));
    if (v) {
        memset(v, 0, sizeof *v);
        v->t = t;
    }
    return v;
}

static int need(reader *r, size_t n)
{
    if ((size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return 0;
    }
    return 1;
}

/* The argument of an item head (big-endian, 0, 1, 2, 4 or 8 bytes); *indef
 * set for additional information 31. */
static uint64_t rd_arg(reader *r, int ai, int *indef)
{
    *indef = 0;
    if (ai < 24)
        return (uint64_t)ai;
    if (ai == 31) {
        *indef = 1;
        return 0;
    }
    if (ai > 27) { /* 28-30: reserved */
        r->bad = 1;
        return 0;
    }
    size_t n = (size_t)1 << (ai - 24);
    if (!need(r, n))
        return 0;
    uint64_t u = 0;
    for (size_t k = 0; k < n; k++)
        u = (u << 8) | r->p[k];
    r->p += n;
    return u;
}

/* An IEEE half (CBOR's shortest float) as a double: built from its bits. */
static double half_to_double(unsigned h)
{
    uint64_t e = (h >> 10) & 0x1f, m = h & 0x3ff, sign = (uint64_t)(h >> 15) << 63, u;
    double x;
    if (e == 0) { /* subnormal: m * 2^-24, exact */
        x = (double)m / 16777216.0;
        return sign ? -x : x;
    }
    u = sign | (e == 31 ? (uint64_t)0x7ff << 52 : (e - 15 + 1023) << 52) | m << 42;
    memcpy(&x, &u, sizeof x);
    return x;
}

static value *rd_value(reader *r, int depth);

/* The items of an array (per = 1) or a map (per = 2): n of them, or up to
 * a break (indef). */
static value *rd_items(reader *r, value *v, uint64_t n, int indef, int per, int depth)
{
    if (!indef && n > (uint64_t)(r->end - r->p) / (uint64_t)per) { /* each item >= 1 byte */
        r->bad = 1;
        return NULL;
    }
    size_t cap = indef ? 8 : (size_t)n, got = 0;
    value **items = arena_alloc(r, (cap ? cap : 1) * sizeof(value *) * (size_t)per);
    for (;;) {
        if (!items)
            return NULL;
        if (indef) {
            if (!need(r, 1))
                return NULL;
            if (*r->p == 0xff) {
                r->p++;
                break;
            }
        } else if (got == n)
            break;
        if (got == cap) {
            value **more = arena_alloc(r, cap * 2 * sizeof(value *) * (size_t)per);
            if (more)
                memcpy(more, items, cap * sizeof(value *) * (size_t)per);
            items = more;
            cap *= 2;
            continue;
        }
        for (int k = 0; k < per; k++) {
            items[got * (size_t)per + (size_t)k] = rd_value(r, depth + 1);
            if (!items[got * (size_t)per + (size_t)k])
                return NULL;
        }
        got++;
    }
    v->items = items;
    v->len = got;
    return v;
}

static value *rd_value(reader *r, int depth)
{
    if (depth > 32 || !need(r, 1)) {
        r->bad = 1;
        return NULL;
    }
    int b = *r->p++, major = b >> 5, ai = b & 31, indef;
    uint64_t u = rd_arg(r, ai, &indef);
    if (r->bad)
        return NULL;
    value *v = NULL;
    switch (major) {
    case 0: case 1: /* unsigned, negative: -1 - u; saturated to 64 bits */
        if (indef)
            break;
        v = new_value(r, V_INT);
        if (v)
            v->i = major == 0 ? (u > INT64_MAX ? INT64_MAX : (int64_t)u)
                              : (u > INT64_MAX ? INT64_MIN : -1 - (int64_t)u);
        return v;
    case 2: case 3: /* bytes, text: definite length only */
        if (indef || !need(r, u))
            break;
        v = new_value(r, major == 2 ? V_BYTES : V_STR);
        if (v) {
            v->s = (const char *)r->p;
            v->len = (size_t)u;
        }
        r->p += u;
        return v;
    case 4: case 5:
        v = new_value(r, major == 4 ? V_LIST : V_DICT);
        return v ? rd_items(r, v, u, indef, major == 4 ? 1 : 2, depth) : NULL;
    case 7:
        if (ai == 20 || ai == 21) {
            v = new_value(r, V_BOOL);
            if (v)
                v->i = ai == 21;
            return v;
        }
        if (ai == 22)
            return new_value(r, V_NONE);
        if (ai >= 25 && ai <= 27) {
            v = new_value(r, V_FLOAT);
            if (!v)
                return NULL;
            if (ai == 25) {
                v->f = half_to_double((unsigned)u);
            } else if (ai == 26) {
                uint32_t w32 = (uint32_t)u;
                float f;
                memcpy(&f, &w32, sizeof f);
                v->f = f;
            } else {
                memcpy(&v->f, &u, sizeof v->f);
            }
            return v;
        }
        break;
    }
    r->bad = 1; /* tags, undefined, simple values, a stray break, chunked strings */
    return NULL;
}

static value *dict_get(const value *d, const char *key)
{
    if (!d || d->t != V_DICT)
        return NULL;
    size_t kl = strlen(key);
    for (size_t k = 0; k < d->len; k++) {
        const value *kv = d->items[2 * k];
        if (kv->t == V_STR && kv->len == kl && memcmp(kv->s, key, kl) == 0)
            return d->items[2 * k + 1];
    }
    return NULL;
}

static int64_t dict_int(const value *d, const char *key, int64_t dflt)
{
    const value *v = dict_get(d, key);
    return v && (v->t == V_INT || v->t == V_BOOL) ? v->i : dflt;
}

static int dict_true(const value *d, const char *key)
{
    const value *v = dict_get(d, key);
    return v && (v->t == V_BOOL || v->t == V_INT) && v->i;
}

/* A timeout: a float or an int, clamped to [0, MAX_GRACE]. */
static double dict_seconds(const value *d, const char *key, double dflt)
{
    const value *v = dict_get(d, key);
    double x = !v ? dflt : v->t == V_FLOAT ? v->f : v->t == V_INT ? (double)v->i : dflt;
    if (!(x >= 0)) /* NaN too */
        return dflt;
    return x > TETHER_MAX_GRACE ? TETHER_MAX_GRACE : x;
}

/* -- writing replies -------------------------------------------------------- */

/* A frame: a 4-byte big-endian length, then the CBOR body. */
typedef struct {
    unsigned char buf[4 + MAX_MSG];
    size_t n;
    int bad;
} writer;

/* One reply is built at a time: one buffer, never zeroed (a 68 KiB memset per
 * reply would be most of a spawn's cost, and touch pages for nothing). */
static writer the_writer;

static writer *wbegin(void)
{
    the_writer.n = 4; /* the length goes first: send_msg */
    the_writer.bad = 0;
    return &the_writer;
}

static void w_bytes(writer *w, const void *p, size_t n)
{
    if (w->n + n > sizeof w->buf) {
        w->bad = 1;
        return;
    }
    memcpy(w->buf + w->n, p, n);
    w->n += n;
}

static void w_byte(writer *w, int c)
{
    unsigned char b = (unsigned char)c;
    w_bytes(w, &b, 1);
}

/* An item head: major type and its argument, in the shortest form. */
static void w_head(writer *w, int major, uint64_t u)
{
    unsigned char b[9];
    int n = u < 24 ? 0 : u <= 0xff ? 1 : u <= 0xffff ? 2 : u <= 0xffffffffu ? 4 : 8;
    b[0] = (unsigned char)(major << 5 | (n == 0 ? (int)u : n == 1 ? 24 : n == 2 ? 25 : n == 4 ? 26 : 27));
    for (int k = 0; k < n; k++)
        b[1 + k] = (unsigned char)(u >> (8 * (n - 1 - k)));
    w_bytes(w, b, (size_t)(1 + n));
}

static void w_int(writer *w, int64_t v)
{
    if (v >= 0)
        w_head(w, 0, (uint64_t)v);
    else
        w_head(w, 1, (uint64_t)(-(v + 1)));
}

/* Length of the well-formed UTF-8 sequence at p (as Python's strict
 * decoder sees it: no overlong forms, no surrogates, nothing above
 * U+10FFFF), or 0 where it is ill-formed. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || len > n)
        return 0;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 2; k < len; k++)
        if (p[k] < 0x80 || p[k] > 0xBF)
            return 0;
    return len;
}

/* A name from the system, which need not be UTF-8: a text string where it
 * is; otherwise a byte string, as it is (a file name: AS_BYTES), or a text
 * string with each undecodable byte as \xHH (a comm, as identity.read
 * shows it: AS_BACKSLASH). */
enum undecodable { AS_BYTES, AS_BACKSLASH };

static void w_text(writer *w, const char *s, size_t n, enum undecodable how)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t out = 0, bad = 0;
    for (size_t k = 0; k < n;) {
        size_t l = utf8_seq(p + k, n - k);
        out += l ? l : 4;
        bad += !l;
        k += l ? l : 1;
    }
    if (!bad || how == AS_BYTES) {
        w_head(w, bad ? 2 : 3, n);
        w_bytes(w, p, n);
        return;
    }
    w_head(w, 3, out);
    for (size_t k = 0; k < n;) {
        size_t l = utf8_seq(p + k, n - k);
        if (l) {
            w_bytes(w, p + k, l);
            k += l;
            continue;
        }
        unsigned b = p[k++];
        static const char hex[] = "0123456789abcdef";
        char e[4] = {'\\', 'x', hex[b >> 4], hex[b & 15]};
        w_bytes(w, e, 4);
    }
}

static void w_str(writer *w, const char *s)
{
    w_text(w, s, strlen(s), AS_BYTES);
}

static void w_key(writer *w, const char *k) { w_str(w, k); }
static void w_bool(writer *w, int b) { w_byte(w, b ? 0xf5 : 0xf4); }
static void w_none(writer *w) { w_byte(w, 0xf6); }
static void w_float(writer *w, double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    w_byte(w, 0xfb);
    for (int k = 7; k >= 0; k--)
        w_byte(w, (int)(u >> (8 * k)) & 0xff);
}
static void w_list(writer *w, size_t n) { w_head(w, 4, n); }
/* maps are written indefinite-length (0xbf ... 0xff): the writer need not
 * count their keys first */
static void w_dict(writer *w) { w_byte(w, 0xbf); }
static void w_end(writer *w) { w_byte(w, 0xff); }

/* ------------------------------------------------------------------------ */
/* the keeper's state                                                       */

enum mech { M_CGROUP, M_SUBREAPER, M_PIDNS };
#define MAX_CHANS 64

static struct {
    enum mech mech;
    int ctl;
    pid_t owner;
    int ownerfd;
    int background;
    char cgroup[4096];  /* the job's cgroup directory (cgroup mechanism) */
    char mount[4096];   /* where cgroup2 is mounted: /proc/PID/cgroup is relative to it */
    int legacy;         /* behave as a kernel without clone3 and cgroup.kill (tests) */
    int no_owner_state; /* answer owner_state as if the owner's /proc could not be read (tests) */
    int cgfd;           /* O_PATH fd of it, for CLONE_INTO_CGROUP */
    int have_clone3;
    int born_killed;    /* a CLONE_INTO_CGROUP child was killed at birth: see op_spawn */
    pid_t pin;          /* the idle job's pin (see pin_job), or 0 */
    int no_pin;         /* a pin could not start (its exec failed): none again */
    int no_prlimit;     /* prlimit on the owner was refused (EPERM): read its /proc file */
    int keep[16];       /* fds given at start for children (keep=): a spawn's "inherit" */
    int nkeep;
    unsigned char ign[65];        /* the signals this keeper ignores */
    struct rlimit lim[RLIM_NLIMITS]; /* its own limits, as it got them (never changed) */
    int sigfd;
    int beacon_event;   /* pipe the owner's beacon is told on (see beacon_wait), or -1 */
    char boot[64];
    /* direct children not yet reaped, and statuses not yet collected */
    pid_t kids[MAX_CHILDREN];
    size_t nkids;
    pid_t done_pid[MAX_CHILDREN];
    int done_st[MAX_CHILDREN];
    size_t ndone;
} K;

/* More owner channels: a forked child's own (see op "channel"), and the
 * children spawned from one, whose exits are pushed there (chan -1: kept
 * here). Apart from K: pages a job that never forks never touches. */
static int chans[MAX_CHANS];
static size_t nchans;
static int serving_chan = -1; /* the channel of the request being served, or -1: the owner's */
/* Who sent the request being served, as the kernel vouches for it
 * (SCM_CREDENTIALS, per message): a socket's SO_PEERCRED is its creator's,
 * fixed at socketpair(), so it cannot tell the owner from a forked worker
 * that dropped privileges and writes on the inherited end. */
static struct ucred sender;
static int have_sender;
static struct ckid {
    pid_t pid;
    int chan;
} *ckids;
static size_t nckids, ckids_cap;

static int is_kid(pid_t pid)
{
    for (size_t k = 0; k < K.nkids; k++)
        if (K.kids[k] == pid)
            return 1;
    return 0;
}

static void drop_kid(pid_t pid)
{
    for (size_t k = 0; k < K.nkids; k++)
        if (K.kids[k] == pid) {
            K.kids[k] = K.kids[--K.nkids];
            return;
        }
}

static void keep_status(pid_t pid, int st)
{
    if (K.ndone < MAX_CHILDREN) {
        K.done_pid[K.ndone] = pid;
        K.done_st[K.ndone] = st;
        K.ndone++;
    }
}

static int take_status(pid_t pid, int *st)
{
    for (size_t k = 0; k < K.ndone; k++)
        if (K.done_pid[k] == pid) {
            *st = K.done_st[k];
            K.ndone--;
            K.done_pid[k] = K.done_pid[K.ndone];
            K.done_st[k] = K.done_st[K.ndone];
            return 1;
        }
    return 0;
}

/* -- sending ---------------------------------------------------------------- */

/* One frame (see writer), with its fds on its first byte; the rest of a
 * short write follows at once, blocking: a frame is never left half sent.
 * With MSG_DONTWAIT, a frame the socket has no room for is not sent (-1). */
static int send_msg(writer *w, const int *fds, int nfds, int flags)
{
    if (w->bad) {
        errno = EMSGSIZE;
        return -1;
    }
    size_t body = w->n - 4;
    w->buf[0] = (unsigned char)(body >> 24);
    w->buf[1] = (unsigned char)(body >> 16);
    w->buf[2] = (unsigned char)(body >> 8);
    w->buf[3] = (unsigned char)body;
    struct iovec iov = {w->buf, w->n};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (nfds > 0) {
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    size_t sent = 0;
    int waits = 0;
    while (sent < w->n) {
        ssize_t n = sendmsg(K.ctl, &mh, MSG_NOSIGNAL | (sent ? 0 : flags));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN && sent && waits++ < 10) { /* (a non-blocking socket) */
            struct pollfd o = {K.ctl, POLLOUT, 0};
            poll(&o, 1, 1000);
            continue;
        }
        if (n <= 0)
            return -1;
        sent += (size_t)n;
        iov.iov_base = w->buf + sent;
        iov.iov_len = w->n - sent;
        mh.msg_control = NULL; /* the fds went with the first part */
        mh.msg_controllen = 0;
    }
    return 0;
}

static void reply_ok(void)
{
    writer *w = wbegin();
    w_dict(w);
    w_key(w, "ok");
    w_bool(w, 1);
    w_end(w);
    send_msg(w, NULL, 0, 0);
}

static void reply_error(const char *kind, int err, const char *strerr, const char *filename)
{
    writer *w = wbegin();
    w_dict(w);
    w_key(w, "ok");
    w_bool(w, 0);
    w_key(w, "kind");
    w_str(w, kind);
    if (err) {
        w_key(w, "errno");
        w_int(w, err);
    }
    w_key(w, "strerror");
    if (strerr)
        w_str(w, strerr);
    else
        w_none(w); /* the errno alone: the owner words it (our libc may word it otherwise) */
    if (filename) {
        w_key(w, "filename");
        w_str(w, filename);
    }
    w_end(w);
    send_msg(w, NULL, 0, 0);
}

/* An exit status, pushed at once so the owner's wait() needs no round trip;
 * kept here if the owner is not reading (the keeper never blocks on it). */
static void report_exit(pid_t pid, int st)
{
    writer *w = wbegin();
    w_dict(w);
    w_key(w, "exit");
    w_int(w, pid);
    w_key(w, "status");
    w_int(w, st);
    w_end(w);
    if (send_msg(w, NULL, 0, MSG_DONTWAIT) < 0)
        keep_status(pid, st);
}

/* -- reaping ---------------------------------------------------------------- */

static void reaped(pid_t pid, int st, int push)
{
    if (pid == K.pin) {
        K.pin = 0; /* killed with the job (cgroup.kill): made again at the next spawn */
        if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
            K.no_pin = 1; /* its exec failed: it would again */
    }
    if (!is_kid(pid))
        return; /* an adopted orphan (subreaper, init): nobody asks for it */
    int chan = K.ctl;
    for (size_t k = 0; k < nckids; k++)
        if (ckids[k].pid == pid) {
            chan = ckids[k].chan;
            ckids[k] = ckids[--nckids];
            break;
        }
    drop_kid(pid);
    if (push && chan >= 0) {
        int ctl = K.ctl; /* pushed to the channel that spawned it */
        K.ctl = chan;
        report_exit(pid, st);
        K.ctl = ctl;
    } else
        keep_status(pid, st);
}

/* Reap everything that has exited; 0 once there are no children at all. */
static int reap_all(int push)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            return 0; /* ECHILD */
        if (pid == 0)
            return 1;
        reaped(pid, st, push);
    }
}

static void drain_sigfd(void)
{
    struct signalfd_siginfo si;
    while (read(K.sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
    }
}

/* ------------------------------------------------------------------------ */
/* ending the job, the mechanism's way                                     */

/* The pids (> 1) of a /proc children list, appended to out[n..cap); the new n. */
static size_t parse_pids(const char *p, pid_t *out, size_t n, size_t cap)
{
    while (*p) {
        char *e;
        long c = strtol(p, &e, 10);
        if (e == p)
            break;
        if (c > 1 && n < cap)
            out[n++] = (pid_t)c;
        p = e;
    }
    return n;
}

/* Children of pid, appended to out; the number added. Every thread's when
 * all_tasks; else only those of its main thread (one file, not a directory
 * and a file per thread: a kill loop, which reads its dead's orphans again
 * from its own list, need not see the rest at once). */
static size_t children_of(pid_t pid, pid_t *out, size_t cap, int all_tasks)
{
    char path[64], buf[65536];
    size_t n = 0;
    if (!all_tasks) {
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
        return read_file(path, buf, sizeof buf) > 0 ? parse_pids(buf, out, 0, cap) : 0;
    }
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    struct dir_walk w;
    if (dir_open(&w, path) < 0)
        return 0;
    for (const struct dent64 *d; (d = dir_next(&w));) {
        if (d->name[0] < '0' || d->name[0] > '9')
            continue;
        char cpath[128];
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%s/children", (int)pid, d->name);
        if (read_file(cpath, buf, sizeof buf) > 0)
            n = parse_pids(buf, out, n, cap);
    }
    close(w.fd);
    return n;
}

/* PIDFD_GET_INFO (Linux 6.13): the ids of a pidfd's process; the struct as
 * that version has it (64 bytes; later kernels take it as it is). */
struct pidfd_info_ {
    uint64_t mask, cgroupid;
    uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
    int32_t exit_code;
};
#define PIDFD_GET_INFO_ _IOWR(0xFF, 11, struct pidfd_info_)

/* The parent of the process held by pidfd fd (pid, as this keeper sees it);
 * 0 if it is gone (reaped), -1 if it could not be read. */
static pid_t pidfd_parent(int fd, pid_t pid)
{
    static int no_info; /* a kernel before 6.13 (or legacy=1): its /proc file instead */
    if (!no_info && !K.legacy) {
        struct pidfd_info_ in = {0};
        if (ioctl(fd, PIDFD_GET_INFO_, &in) == 0)
            return (pid_t)in.ppid;
        if (errno == ESRCH)
            return 0;
        if (errno != ENOTTY && errno != EINVAL)
            return -1;
        no_info = 1;
    }
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_file(path, buf, sizeof buf) <= 0)
        return errno == ENOENT || errno == ESRCH ? 0 : -1;
    const char *ppid = stat_field(buf, 4);
    return ppid ? (pid_t)strtol(ppid, NULL, 10) : -1;
}

enum kill_result { KILLED, NOT_KILLED, TRY_AGAIN };

/* SIGKILL pid, read a moment ago from the children list of parent: this
 * keeper's (0: its own child, which only this loop reaps, so the pid is
 * still that child's), or a process this loop SIGKILLed already. That one
 * forks no more, but a wait of its already under way may reap the child,
 * and the pid may go to another process: so the pid is pinned (a pidfd) and
 * signalled only if its parent is still parent, or this keeper (the child
 * was re-parented to us). NOT_KILLED: gone, or not a child of either now
 * (re-parented to a subreaper of the job's below us, it turns up again in
 * that one's list; reused, its subtree is not the job's); TRY_AGAIN: no fd
 * to pin it with. */
static enum kill_result kill_pid(pid_t pid, pid_t parent, pid_t me)
{
    if (parent == 0)
        return kill(pid, SIGKILL) == 0 ? KILLED : errno == ESRCH ? NOT_KILLED : TRY_AGAIN;
    int fd = pidfd_open_(pid);
    if (fd < 0)
        return errno == ESRCH ? NOT_KILLED : TRY_AGAIN;
    pid_t pp = pidfd_parent(fd, pid);
    int ours = pp == parent || pp == me;
    if (ours)
        pidfd_signal_(fd, SIGKILL);
    close(fd);
    return ours ? KILLED : pp < 0 ? TRY_AGAIN : NOT_KILLED;
}

static pid_t scratch[MAX_CHILDREN];

/* The pids a kill loop has signalled and not yet reaped (open addressing:
 * 0 empty, -1 removed), whose subtrees a round does not read again.
 * Allocated for one kill loop (a table that was never made, or could not
 * grow, only means reading the tree again: the old, slower way). */
struct pidset {
    pid_t *slot;
    size_t cap, used; /* used: slots taken, removed ones included */
};

static size_t ps_find(const struct pidset *s, pid_t p)
{
    size_t k = ((uint32_t)p * 2654435761u) & (s->cap - 1);
    while (s->slot[k] != 0 && s->slot[k] != p)
        k = (k + 1) & (s->cap - 1);
    return k;
}

static int ps_has(const struct pidset *s, pid_t p)
{
    return s->slot && s->slot[ps_find(s, p)] == p;
}

static void ps_del(struct pidset *s, pid_t p)
{
    if (!s->slot)
        return;
    size_t k = ps_find(s, p);
    if (s->slot[k] == p)
        s->slot[k] = -1;
}

static void ps_add(struct pidset *s, pid_t p)
{
    if (!s->slot || (s->used + 1) * 2 > s->cap) {
        struct pidset g = {calloc(s->cap ? s->cap * 2 : 256, sizeof(pid_t)), s->cap ? s->cap * 2 : 256, 0};
        if (!g.slot)
            return;
        for (size_t k = 0; k < s->cap; k++)
            if (s->slot[k] > 0) {
                g.slot[ps_find(&g, s->slot[k])] = s->slot[k];
                g.used++;
            }
        free(s->slot);
        *s = g;
    }
    size_t k = ps_find(s, p);
    if (s->slot[k] != p) {
        s->slot[k] = p;
        s->used++;
    }
}

/* A kill round reads a process's children before it kills it, except in
 * a fan-out wider than this: a worker pool, a `cmd &` loop, whose members
 * are nearly all leaves. There, reading each empty children file (and the
 * /proc entries the read creates, torn down again at the reap) costs a few
 * times the kill, and on two CPUs the keeper's time is the dying's
 * (bench/kill_latency.py --keeper-baseline, 97 sleeps under one shell,
 * each read: 1.05x the PID-namespace teardown; not: 1.00x, the same run).
 * What a member forked comes to this subreaper when it exits, for the next
 * round. */
#define WIDE_FANOUT 16

/* Beside scratch[k], for a k past this keeper's own children: the process
 * it was read as a child of, and whether it was one of more than WIDE_FANOUT. */
static pid_t scratch_parent[MAX_CHILDREN];
static unsigned char scratch_wide[MAX_CHILDREN];

/* One round of the kill loop over scratch[0..n), this keeper's children
 * just read, and the subtrees found on the way, appended behind them. A
 * process not killed yet has its children read first (unless wide), then is
 * killed: read after the kill, the list raced its exit, whose re-parenting
 * emptied it, and they waited a round. Its subtree is walked only if the
 * kill was ours (kill_pid: otherwise it is gone, or not the job's). One
 * killed before is read again only in a whole round: what it forked since
 * comes to us when it exits. stuck: every thread's children, and every
 * process's, wide or not. */
static void kill_round(struct pidset *killed, size_t n, pid_t me, int whole, int stuck)
{
    size_t own = n, fresh = 0; /* scratch[0..own): ours, fresh of them not killed yet */
    for (size_t k = 0; k < own; k++)
        fresh += !ps_has(killed, scratch[k]);
    for (size_t k = 0; k < n; k++) {
        pid_t pid = scratch[k], parent = k < own ? 0 : scratch_parent[k];
        int wide = k < own ? fresh > WIDE_FANOUT : scratch_wide[k];
        int before = ps_has(killed, pid);
        if (before && !whole)
            continue;
        size_t got = wide && !stuck ? 0 : children_of(pid, scratch + n, MAX_CHILDREN - n, stuck);
        if (!before) {
            if (kill_pid(pid, parent, me) != KILLED)
                continue; /* what was read is not walked */
            ps_add(killed, pid);
        }
        for (size_t j = n; j < n + got; j++) {
            scratch_parent[j] = pid;
            scratch_wide[j] = got > WIDE_FANOUT;
        }
        n += got;
    }
}

/* The subreaper's (and an init's) kill loop: until waitpid says ECHILD.
 * Each process is killed as soon as it is found, parents before their
 * children, so the first exits run on the other CPU while the walk goes on.
 * The dying need not be read again: what one of them forked before the kill
 * (a child this loop never saw) is re-parented to this subreaper when its
 * parent exits, so after the first round a round reads our own children and
 * the subtrees of those not killed yet. Rounds are a millisecond apart: the
 * CPU is the dying's, whose exits are the cost of the whole (walking them
 * again and again, or waking at each SIGCHLD, slowed their exits down:
 * bench/kill_latency.py, 100 processes, 8.4 -> 7.4 ms and 7.2 -> 6.9 ms).
 * For the same reason a round reads only each process's main thread's
 * children (one file; a thread's own children come to us with the rest once
 * their process is dead). A process stuck dying (uninterruptible sleep)
 * hides what it forked until it exits, so the whole tree, every thread, is
 * read again once 20 ms pass without a reap. */
static int kill_descendants(double timeout)
{
    double deadline = now_s() + timeout, progress = 0;
    pid_t me = getpid();
    struct pidset killed = {0};
    int done = 0;
    while (!done && now_s() < deadline) {
        for (;;) {
            int st;
            pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
            if (pid < 0 && errno == EINTR)
                continue;
            if (pid < 0) {
                done = 1; /* ECHILD */
                break;
            }
            if (pid == 0)
                break;
            ps_del(&killed, pid);
            reaped(pid, st, 1);
            progress = now_s();
        }
        if (done)
            break;
        int stuck = killed.slot && now_s() - progress >= 0.02;
        int whole = !killed.slot || stuck;
        kill_round(&killed, children_of(me, scratch, MAX_CHILDREN, stuck), me, whole, stuck);
        if (whole)
            progress = now_s();
        nap_us(1000);
        drain_sigfd();
    }
    free(killed.slot);
    return done;
}

static int cg_populated(void)
{
    char path[4200], buf[256];
    snprintf(path, sizeof path, "%s/cgroup.events", K.cgroup);
    if (read_file(path, buf, sizeof buf) < 0)
        return errno != ENOENT; /* gone: empty */
    char *p = strstr(buf, "populated ");
    return p ? p[10] != '0' : 1;
}

/* pid's cgroup v2 path from its /proc/PID/cgroup ("0::PATH", relative to
 * where cgroup2 is mounted, K.mount), in buf; NULL if unreadable. */
static const char *proc_cgroup(pid_t pid, char *buf, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
    if (read_file(path, buf, size) <= 0)
        return NULL;
    char *rel = strstr(buf, "0::");
    if (!rel || (rel != buf && rel[-1] != '\n'))
        return NULL;
    rel += 3;
    char *nl = strchr(rel, '\n');
    if (nl)
        *nl = '\0';
    return rel;
}

/* The job's cgroup as /proc/PID/cgroup writes it (K.cgroup below K.mount), or NULL. */
static const char *job_cgroup_rel(void)
{
    size_t ml = strlen(K.mount);
    if (!ml || strncmp(K.cgroup, K.mount, ml) != 0)
        return NULL;
    return K.cgroup + ml;
}

/* Whether pid's own cgroup file puts it in the job's cgroup or below. */
static int cg_is_member(pid_t pid)
{
    char buf[4200];
    const char *rel = proc_cgroup(pid, buf, sizeof buf), *job = job_cgroup_rel();
    if (!rel || !job)
        return 0;
    size_t l = strlen(job);
    return strncmp(rel, job, l) == 0 && (rel[l] == '\0' || rel[l] == '/');
}

/* CLONE_INTO_CGROUP checks, as a write to cgroup.procs would, that we may
 * write the cgroup.procs file of the job's cgroup and of the lowest cgroup
 * above both it and ours. The kernel takes each file's inode for the check:
 * with no dentry holding it, it allocates one and evicts it again, on every
 * spawn. An O_PATH descriptor on each file keeps both inodes. Best effort: a
 * path it cannot work out is left alone. */
static void hold_procs_files(void)
{
    char buf[4200], path[4200];
    const char *ours = proc_cgroup(getpid(), buf, sizeof buf), *job = job_cgroup_rel();
    if (!ours || !job)
        return;
    size_t common = 0; /* the longest shared prefix that ends a path component */
    for (size_t k = 0;; k++) {
        int end_o = ours[k] == '\0' || ours[k] == '/', end_j = job[k] == '\0' || job[k] == '/';
        if (end_o && end_j)
            common = k;
        if (ours[k] != job[k] || ours[k] == '\0')
            break;
    }
    snprintf(path, sizeof path, "%s/cgroup.procs", K.cgroup);
    openat(AT_FDCWD, path, O_PATH | O_CLOEXEC);
    snprintf(path, sizeof path, "%s%.*s/cgroup.procs", K.mount, (int)common, job);
    openat(AT_FDCWD, path, O_PATH | O_CLOEXEC);
}

/* fn(path, depth + 1) for each subdirectory of dir (a cgroup's child
 * cgroups: nested jobs). One level of the walk; fn recurses. */
static void each_subdir(const char *dir, int depth, void (*fn)(const char *, int))
{
    struct dir_walk w;
    if (dir_open(&w, dir) < 0)
        return;
    char path[4200];
    for (const struct dent64 *d; (d = dir_next(&w));)
        if (d->type == DT_DIR && strcmp(d->name, ".") && strcmp(d->name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, d->name);
            fn(path, depth + 1);
        }
    close(w.fd);
}

/* Linux < 5.14 has no cgroup.kill: freeze (nobody forks between the read
 * and the kill), SIGKILL each member of the cgroup and every one below it
 * through a pidfd, checked to be a member still once pinned, then thaw. */
static void cg_kill_each_in(const char *dir, int depth)
{
    char path[4200];
    static char buf[65536];
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    ssize_t len = read_file(path, buf, sizeof buf);
    for (char *p = buf; len > 0 && *p;) {
        char *e;
        long c = strtol(p, &e, 10);
        if (e == p)
            break;
        p = e;
        if (c <= 1)
            continue;
        int fd = pidfd_open_((pid_t)c);
        if (fd < 0)
            continue;
        if (cg_is_member((pid_t)c))
            pidfd_signal_(fd, SIGKILL);
        close(fd);
    }
    if (depth <= 16)
        each_subdir(dir, depth, cg_kill_each_in);
}

static void cg_kill_each(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/cgroup.freeze", K.cgroup);
    write_file(path, "1");
    cg_kill_each_in(K.cgroup, 0);
    write_file(path, "0");
}

static int kill_cgroup(double timeout)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/cgroup.kill", K.cgroup);
    int has_kill = !K.legacy && access(path, F_OK) == 0;
    double deadline = now_s() + timeout;
    for (;;) {
        if (has_kill)
            write_file(path, "1");
        else
            cg_kill_each();
        reap_all(1);
        if (!cg_populated())
            return 1;
        if (now_s() > deadline)
            return 0;
        nap_us(500);
    }
}

static void kill_all(double timeout)
{
    if (K.mech == M_CGROUP)
        kill_cgroup(timeout);
    else if (K.mech == M_SUBREAPER)
        kill_descendants(timeout);
    /* pidns: the owner ends the members by identity from outside (this init
     * sees outer pids in the shared /proc); here we only reap. Ending the
     * whole namespace is this process's exit. */
    reap_all(1);
}

static void rm_tree(const char *dir, int depth)
{
    /* deepest first: nested jobs' directories before their parent's */
    each_subdir(dir, depth, rm_tree);
    for (int k = 0; k < 20 && rmdir(dir) < 0 && errno != ENOENT; k++)
        nap_us(2000);
}

/* The run directory a job's cgroup is in, tether-<pid>-<start>, removed
 * when no other job is in it (a nested job's parent is no run directory). */
static void rmdir_run_dir_of(const char *cgroup)
{
    char run[4096];
    snprintf(run, sizeof run, "%s", cgroup);
    char *slash = strrchr(run, '/');
    if (slash) {
        *slash = '\0';
        const char *base = strrchr(run, '/');
        base = base ? base + 1 : run;
        if (strncmp(base, "tether-", 7) == 0)
            rmdir(run);
    }
}

static void cleanup(void)
{
    if (K.mech != M_CGROUP || !K.cgroup[0])
        return;
    rm_tree(K.cgroup, 0);
    rmdir_run_dir_of(K.cgroup);
}

/* A background cgroup job outlives its owner: wait (no busy loop: the
 * kernel flags cgroup.events with POLLPRI when "populated" changes) until
 * its last member is gone, then remove the directory. */
static void wait_empty(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/cgroup.events", K.cgroup);
    int fd = openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    while (cg_populated()) {
        struct pollfd p = {fd, POLLPRI, 0};
        if (fd < 0 || poll(&p, 1, 10000) < 0)
            nap_us(100000);
    }
    if (fd >= 0)
        close(fd);
}

static void end_for_dead_owner(void) __attribute__((noreturn));
static void end_for_dead_owner(void)
{
    if (K.mech == M_PIDNS && !K.background)
        _exit(0); /* PID 1 of the job's namespace: the kernel kills the rest at once */
    if (K.background) {
        /* outlives its owner on purpose: reap until the job is empty */
        for (;;) {
            int st;
            pid_t pid = waitpid(-1, &st, __WALL);
            if (pid < 0 && errno == EINTR)
                continue;
            if (pid < 0)
                break;
        }
        if (K.mech == M_CGROUP)
            wait_empty();
        cleanup();
        _exit(0);
    }
    kill_all(KILL_BOUND);
    cleanup();
    _exit(0);
}

/* ------------------------------------------------------------------------ */
/* spawning                                                                 */

/* What the child does between clone and exec; its failure is reported on
 * errfd as (stage, errno). Async-signal-safe calls only. */
struct spawn_req {
    char *const *argv;
    char *const *envp;
    const char *exe;         /* as given: searched in path when it has no '/' */
    char *const *path;       /* PATH entries */
    const char *cwd;         /* or NULL: fchdir(cwd_fd) */
    int cwd_fd;
    int nmap;
    int map_src[MAX_FDS];    /* lifted fds ... */
    int map_dst[MAX_FDS];    /* ... and the child fd numbers they become */
    int setsid_;
    pid_t pgroup;            /* -1: leave; 0: new group; >0: join */
    sigset_t mask;
    unsigned char ign[65];   /* 1: SIG_IGN in the child, else SIG_DFL */
    int umask_;              /* -1: leave */
    int ctty;
    int nlim;
    int lim_res[16];
    struct rlimit lim[16];
    int errfd;
    int into_cgroup_by_hand; /* no clone3: move ourselves in before exec */
    int vforked;             /* set by clone_child: we slept until its exec or exit */
    int only_stdio;          /* close every fd above 2 (but errfd, close-on-exec) */
    int close_unmapped_std;  /* a stdio fd the map does not name: closed, not ours */
};

static void close_others(int a, int b);
static void close_span(unsigned lo, unsigned hi);

/* sigaction by the raw system call: it reaches glibc's own 32 and 33 too
 * (the library's sigaction refuses them). */
static void raw_signal(int sig, void (*handler)(int))
{
    struct {
        void (*handler)(int);
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } ka = {handler, 0, NULL, 0};
    syscall(SYS_rt_sigaction, sig, &ka, NULL, sizeof(uint64_t));
}

static void child_fail(int errfd, char stage, int err) __attribute__((noreturn));
static void child_fail(int errfd, char stage, int err)
{
    unsigned char b[5] = {(unsigned char)stage, (unsigned char)err, (unsigned char)(err >> 8),
                          (unsigned char)(err >> 16), (unsigned char)(err >> 24)};
    ssize_t n = write(errfd, b, sizeof b);
    (void)n;
    _exit(127);
}

/* This keeper's umask, the owner's when it started us, never changed (a
 * child whose owner has the same needs no call), or -1 where unknown. */
static int keeper_umask = -1;

static void child_main(struct spawn_req *q) __attribute__((noreturn));
static void child_main(struct spawn_req *q)
{
    /* "I ran": a child the kernel kills before its first instruction never
     * says it (see op_spawn) */
    if (write(q->errfd, "a", 1) != 1)
        _exit(127);
    if (q->into_cgroup_by_hand) {
        char path[4200];
        snprintf(path, sizeof path, "%s/cgroup.procs", K.cgroup);
        if (write_file(path, "0") < 0)
            child_fail(q->errfd, 'g', errno);
    }
    if (q->setsid_) {
        if (setsid() < 0)
            child_fail(q->errfd, 's', errno);
    } else if (q->pgroup >= 0 && setpgid(0, q->pgroup) < 0) {
        child_fail(q->errfd, 'p', errno);
    }
    /* fds: every source was lifted above every target first */
    for (int k = 0; k < q->nmap; k++) {
        if (dup2(q->map_src[k], q->map_dst[k]) < 0)
            child_fail(q->errfd, 'd', errno);
    }
    if (q->only_stdio)
        close_others(q->errfd, -1);
    /* An owner's stdio fd that was closed or close-on-exec is not in the map:
     * closed in the child too, as subprocess's child would find it, not our
     * /dev/null */
    for (int fd = 0; q->close_unmapped_std && fd < 3; fd++) {
        int mapped = 0;
        for (int k = 0; k < q->nmap; k++)
            mapped |= q->map_dst[k] == fd;
        if (!mapped)
            close(fd);
    }
    if (q->ctty && ioctl(0, TIOCSCTTY, 0) < 0)
        child_fail(q->errfd, 't', errno);
    for (int k = 0; k < q->nlim; k++)
        if (setrlimit(q->lim_res[k], &q->lim[k]) < 0)
            child_fail(q->errfd, 'r', errno);
    if (q->umask_ >= 0 && q->umask_ != keeper_umask)
        umask((mode_t)q->umask_);
    if (q->cwd) {
        if (chdir(q->cwd) < 0)
            child_fail(q->errfd, 'c', errno);
    } else if (q->cwd_fd >= 0 && fchdir(q->cwd_fd) < 0) {
        child_fail(q->errfd, 'c', errno);
    }
    /* The owner's ignored signals, and nothing else: exec resets handled
     * ones, so only what this keeper ignores and the owner does not (and
     * the other way round) needs a call. */
    for (int s = 1; s < 65; s++)
        if (q->ign[s] != K.ign[s])
            raw_signal(s, q->ign[s] ? SIG_IGN : SIG_DFL);
    sigprocmask(SIG_SETMASK, &q->mask, NULL);
    if (strchr(q->exe, '/')) {
        execve(q->exe, q->argv, q->envp);
        child_fail(q->errfd, 'e', errno);
    }
    /* subprocess's search over the owner's PATH (CPython's
     * _posixsubprocess, not execvp's): every candidate in order, and the
     * first error other than ENOENT/ENOTDIR is the one reported - a later
     * candidate that runs still wins. An empty name makes "dir/": EACCES. */
    int first = 0, last = ENOENT;
    char full[4200];
    for (char *const *d = q->path; *d; d++) {
        size_t dl = strlen(*d), el = strlen(q->exe);
        if (dl + el + 2 > sizeof full) {
            first = first ? first : ENAMETOOLONG;
            continue;
        }
        if (dl) {
            memcpy(full, *d, dl);
            full[dl] = '/';
            memcpy(full + dl + 1, q->exe, el + 1);
        } else {
            memcpy(full, q->exe, el + 1);
        }
        execve(full, q->argv, q->envp);
        last = errno;
        if (!first && errno != ENOENT && errno != ENOTDIR)
            first = errno;
    }
    child_fail(q->errfd, 'e', first ? first : last);
}

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define HAVE_CLONE3_VM 1
/* The child's stack while it shares our memory (one child at a time: we
 * sleep until it has exec'd). Only the pages it touches cost anything. */
static char child_stack[64 * 1024] __attribute__((aligned(64)));

/* clone3 with CLONE_VM | CLONE_VFORK: posix_spawn's trick with clone3's
 * flags. The child borrows our memory instead of a copy of it (no page
 * tables copied and write-protected, no TLB shootdown, no copy-on-write
 * faults, nothing to tear down at its exec: fork+exec of a small program
 * measured 141 us to its exec here, this 71 us), and we sleep until its
 * exec or exit. Trap: a child that shares our memory must never return
 * into our stack frames - returning from a syscall() wrapper would pop the
 * return address our own return needs - so it starts on its own stack,
 * in child_main, which never returns; and it must run none of our signal
 * handlers (this program installs none: every disposition is SIG_DFL or
 * SIG_IGN, and signals go to a signalfd). Needs assembly for the stack
 * switch, so x86-64 only (else the copying clone3 below); an ASan build
 * copies too (its shadow stack bookkeeping cannot follow the switch). */
static long clone3_vm(struct clone_args *ca, struct spawn_req *q)
{
    ca->flags |= CLONE_VM | CLONE_VFORK;
    ca->stack = (uint64_t)(uintptr_t)child_stack;
    ca->stack_size = sizeof child_stack;
    register void *arg __asm__("r8") = q;
    register void (*fn)(struct spawn_req *) __asm__("r9") = child_main;
    long ret = SYS_clone3;
    /* the child: rbp cleared (no frame above it), q in rdi, child_main on
     * the new stack's 16-byte aligned top; should it ever return, exit 127 */
    __asm__ volatile("syscall\n\t"
                     "testq %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xorl %%ebp, %%ebp\n\t"
                     "movq %%r8, %%rdi\n\t"
                     "callq *%%r9\n\t"
                     "movl $127, %%edi\n\t"
                     "movl $60, %%eax\n\t"
                     "syscall\n"
                     "1:"
                     : "+a"(ret)
                     : "D"(ca), "S"(sizeof *ca), "r"(arg), "r"(fn)
                     : "rcx", "r11", "memory", "cc");
    if (ret < 0) {
        errno = (int)-ret;
        return -1;
    }
    return ret;
}
#endif

/* Start the child: straight into the job's cgroup when we can, else in
 * ours and it moves itself in before exec (into_cgroup_by_hand). */
static pid_t clone_child(struct spawn_req *q, int *pidfd)
{
    int into = K.have_clone3 && K.mech == M_CGROUP && !K.born_killed;
    q->into_cgroup_by_hand = K.mech == M_CGROUP && !into;
    if (K.have_clone3) {
        struct clone_args ca;
        memset(&ca, 0, sizeof ca);
        ca.flags = CLONE_PIDFD | (into ? CLONE_INTO_CGROUP : 0);
        ca.pidfd = (uint64_t)(uintptr_t)pidfd;
        ca.exit_signal = SIGCHLD;
        if (into)
            ca.cgroup = (uint64_t)K.cgfd;
#ifdef HAVE_CLONE3_VM
        long pid = clone3_vm(&ca, q);
        q->vforked = pid > 0;
#else
        long pid = syscall(SYS_clone3, &ca, sizeof ca);
        if (pid == 0)
            child_main(q);
#endif
        if (pid > 0)
            return (pid_t)pid;
        if (errno != ENOSYS && errno != E2BIG)
            return -1;
        K.have_clone3 = 0; /* an older kernel: fork, and move in by hand */
        q->into_cgroup_by_hand = K.mech == M_CGROUP;
    }
    pid_t pid = fork();
    if (pid == 0)
        child_main(q);
    if (pid > 0)
        *pidfd = pidfd_open_(pid);
    return pid;
}

/* Clone the child and follow it to its exec: its pid, with what it wrote
 * on its error pipe in b and *n ("a" once it runs, then the stage and
 * errno where it failed; nothing at all: killed before its first
 * instruction), or -1 with errno (no child). */
static pid_t spawn_followed(struct spawn_req *q, int *pidfd, unsigned char b[6], ssize_t *n)
{
    for (;;) {
        int pipefd[2];
        /* non-blocking: after a vfork-style clone all the child will ever
         * write is there (see below) */
        if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) < 0)
            return -1;
        q->errfd = pipefd[1];
        q->vforked = 0;
        *pidfd = -1;
        pid_t pid = clone_child(q, pidfd);
        int err = errno;
        close(pipefd[1]); /* ours: the read below sees EOF at the child's exec */
        if (pid < 0) {
            close(pipefd[0]);
            errno = err;
            return -1;
        }
        /* A vfork-style child woke us at its exec (past the point of no
         * return) or its exit, so what it wrote is all it will write, and
         * one read takes it all; its copy of the pipe closes only later in
         * exec, and waiting for that EOF measured ~75 us. A copying clone
         * runs beside us: read to EOF. */
        if (!q->vforked)
            fcntl(pipefd[0], F_SETFL, 0);
        *n = 0;
        for (;;) {
            ssize_t got = read(pipefd[0], b + *n, 6 - (size_t)*n);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                break;
            *n += got;
            if (*n == 6 || q->vforked)
                break;
        }
        close(pipefd[0]);
        if (*n > 0 || K.mech != M_CGROUP || K.born_killed)
            return pid;
        /* Killed before its first instruction. Linux 6.14 to at least 6.18
         * compares the kill count of the *parent's* cgroup with the
         * target's for CLONE_INTO_CGROUP, so once the job's cgroup (or an
         * ancestor) has seen a cgroup.kill, every child cloned into it from
         * outside is SIGKILLed at birth. It never ran: start it again the
         * old way (born here, moved in before exec), and from now on. */
        int st;
        while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR) {
        }
        if (*pidfd >= 0)
            close(*pidfd);
        K.born_killed = 1;
    }
}

/* The identity of a just-spawned child, read before anything can reap it:
 * (pid, start, boot, ppid, pgid, sid, uid, state, comm) as identity.read. */
static int write_ident(writer *w, pid_t pid, int pidfd)
{
    char path[64], stat[1024], status[2048];
    if (pidfd >= 0 && K.mech == M_PIDNS) {
        /* the pid as our /proc mount names it: the outer one in a PID
         * namespace (this init's own view says 2, 3, ...) */
        snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
        if (read_file(path, status, sizeof status) > 0) {
            char *p = strstr(status, "\nPid:");
            long outer = p ? strtol(p + 5, NULL, 10) : 0;
            if (outer <= 0)
                return 0; /* gone already, or not visible from here */
            pid = (pid_t)outer;
        }
    }
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_file(path, stat, sizeof stat) <= 0)
        return 0;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if (read_file(path, status, sizeof status) <= 0)
        return 0;
    char *open_ = strchr(stat, '('), *close_ = strrchr(stat, ')');
    if (!open_ || !close_ || close_[1] != ' ')
        return 0;
    char state = close_[2];
    long long f[22] = {0};
    char *p = close_ + 4;
    for (int k = 1; k < 20 && *p; k++) { /* fields after state: ppid, pgrp, session, ... */
        f[k] = strtoll(p, &p, 10);
        while (*p == ' ')
            p++;
    }
    const char *started = stat_field(stat, 22);
    if (!started)
        return 0;
    long long start = strtoll(started, NULL, 10);
    long uid = -1;
    char *u = strstr(status, "\nUid:");
    if (u)
        uid = strtol(u + 5, NULL, 10);
    char comm[64];
    size_t cl = (size_t)(close_ - open_ - 1);
    if (cl >= sizeof comm)
        cl = sizeof comm - 1;
    memcpy(comm, open_ + 1, cl);
    comm[cl] = '\0';
    char st[2] = {state, 0};
    w_key(w, "ident");
    w_list(w, 9);
    w_int(w, pid);
    w_int(w, start);
    w_str(w, K.boot);
    w_int(w, f[1]);
    w_int(w, f[2]);
    w_int(w, f[3]);
    w_int(w, uid);
    w_str(w, st);
    w_text(w, comm, strlen(comm), AS_BACKSLASH);
    return 1;
}

static char *dup_cstr(reader *r, const value *v)
{
    if (!v || (v->t != V_BYTES && v->t != V_STR))
        return NULL;
    if (memchr(v->s, '\0', v->len))
        return NULL;
    char *s = arena_alloc(r, v->len + 1);
    if (s) {
        memcpy(s, v->s, v->len);
        s[v->len] = '\0';
    }
    return s;
}

/* The environment of the last spawn request that carried one: a request
 * with env_same reuses it (the owner sends its environment again only when
 * it changed: ~40 entries encoded, sent and parsed on every spawn). */
static char **saved_env;

static int save_env(char *const *ev, size_t n)
{
    size_t total = (n + 1) * sizeof(char *);
    for (size_t k = 0; k < n; k++)
        total += strlen(ev[k]) + 1;
    char **vec = malloc(total);
    if (!vec)
        return -1;
    char *p = (char *)(vec + n + 1);
    for (size_t k = 0; k < n; k++) {
        size_t l = strlen(ev[k]) + 1;
        memcpy(p, ev[k], l);
        vec[k] = p;
        p += l;
    }
    vec[n] = NULL;
    free(saved_env);
    saved_env = vec;
    return 0;
}

/* The child is to set limit res to (cur, max) - unless it has it from us
 * already (a fork keeps the keeper's limits). An unknown res is kept: the
 * child's setrlimit then fails, and that failure is the reply. */
static void want_limit(struct spawn_req *q, int res, rlim_t cur, rlim_t max)
{
    if (q->nlim >= 16)
        return;
    if (res >= 0 && res < RLIM_NLIMITS && K.lim[res].rlim_cur == cur && K.lim[res].rlim_max == max)
        return;
    q->lim_res[q->nlim] = res;
    q->lim[q->nlim].rlim_cur = cur;
    q->lim[q->nlim].rlim_max = max;
    q->nlim++;
}

/* RLIMIT_NPROC is checked at the fork, against the forking process's soft
 * limit: ours, not the one the child sets after its clone. For the clone we
 * take the owner's (within our hard one), so the spawn fails with EAGAIN
 * where the owner's own fork would (as the Python keeper, which takes every
 * limit around its spawn); the caller gives ours back. 1 if it was taken. */
static int take_nproc(const struct spawn_req *q)
{
    for (int k = 0; k < q->nlim; k++) {
        if (q->lim_res[k] != RLIMIT_NPROC || q->lim[k].rlim_cur == K.lim[RLIMIT_NPROC].rlim_cur)
            continue;
        struct rlimit r = K.lim[RLIMIT_NPROC];
        r.rlim_cur = q->lim[k].rlim_cur < r.rlim_max ? q->lim[k].rlim_cur : r.rlim_max;
        return setrlimit(RLIMIT_NPROC, &r) == 0;
    }
    return 0;
}

/* owner_state: the owner's ignored signals, umask (want_umask) and resource
 * limits, read by us from its /proc entries while it waits for our reply -
 * its state as of its popen(), as when it sent them, for one request
 * instead of three reads in the interpreter. A PID-namespace keeper still
 * sees them (its /proc is the owner's). -1 where they cannot be read: the
 * owner then sends them itself. */
static int read_owner_state(struct spawn_req *q, int restore, int want_umask)
{
    char path[64], buf[4096];
    if (K.no_owner_state) {
        errno = EPERM;
        return -1;
    }
    snprintf(path, sizeof path, "/proc/%d/status", (int)K.owner);
    ssize_t got_status = read_file(path, buf, sizeof buf);
    if (got_status <= 0) {
        if (got_status == 0)
            errno = EPROTO; /* empty: not as this kernel writes it */
        return -1;
    }
    const char *ig = strstr(buf, "\nSigIgn:"), *um = strstr(buf, "\nUmask:");
    errno = EPROTO; /* for what follows: an entry not as this kernel writes it */
    if (!ig || (want_umask && !um))
        return -1;
    unsigned long long mask = strtoull(ig + 8, NULL, 16);
    unsigned char ign[65] = {0};
    for (int s = 1; s < 65; s++)
        /* never SIGCHLD (ignored, the kernel would reap our children); with
         * restore_signals the child gets SIGPIPE and SIGXFSZ back, as
         * subprocess's does */
        ign[s] = (mask >> (s - 1)) & 1 && s != SIGCHLD &&
                 !(restore && (s == SIGPIPE || s == SIGXFSZ));
    struct rlimit got[RLIM_NLIMITS];
    int res = 0;
    /* prlimit where we can name the owner (a third of the file's cost);
     * refused once (EPERM: the owner's ids differ from ours), always */
    while (K.mech != M_PIDNS && !K.no_prlimit && res < RLIM_NLIMITS &&
           prlimit(K.owner, res, NULL, &got[res]) == 0)
        res++;
    if (res < RLIM_NLIMITS && errno == EPERM)
        K.no_prlimit = 1;
    if (res == RLIM_NLIMITS)
        goto have_limits;
    /* else (a PID namespace, or an owner whose ids differ: EPERM) its file:
     * "Limit  Soft Limit  Hard Limit  Units" then one line per resource, in
     * RLIMIT_* order; the name column is 25 characters and a space */
    snprintf(path, sizeof path, "/proc/%d/limits", (int)K.owner);
    char lim[4096];
    ssize_t got_limits = read_file(path, lim, sizeof lim);
    if (got_limits <= 0) {
        if (got_limits == 0)
            errno = EPROTO;
        return -1;
    }
    errno = EPROTO;
    const char *line = strchr(lim, '\n');
    for (res = 0; res < RLIM_NLIMITS; res++) {
        if (!line || strnlen(line + 1, 27) < 27)
            return -1;
        const char *p = line + 1 + 26;
        rlim_t v[2];
        for (int k = 0; k < 2; k++) {
            while (*p == ' ')
                p++;
            if (strncmp(p, "unlimited", 9) == 0) {
                v[k] = RLIM_INFINITY;
                p += 9;
            } else {
                char *e;
                v[k] = (rlim_t)strtoull(p, &e, 10);
                if (e == p)
                    return -1;
                p = e;
            }
        }
        got[res].rlim_cur = v[0];
        got[res].rlim_max = v[1];
        line = strchr(line + 1, '\n');
    }
have_limits:
    memcpy(q->ign, ign, sizeof ign);
    if (want_umask)
        q->umask_ = (int)strtol(um + 7, NULL, 8);
    q->nlim = 0;
    for (res = 0; res < RLIM_NLIMITS; res++)
        want_limit(q, res, got[res].rlim_cur, got[res].rlim_max);
    return 0;
}

/* An idle cgroup job keeps one sleeping process, its pin, in a child
 * cgroup of its own (PIN_DIR). The first process into an empty cgroup and
 * the last one out flip "populated" in cgroup.events, which the kernel
 * reports through a workqueue at once unless it did so within the last
 * 10 ms (bench/cgroup_spawn.py, clone3+exec+wait of /bin/true 50 ms apart:
 * 1576 us into an empty cgroup, 1320 with a process below it, 1220 outside
 * any). A tight loop never paid it; a job that runs one command now and
 * then paid it every time. Every reader of a job's members skips PIN_DIR
 * (cgroupfs.procs and is_pin, ps, the reaper, tether-shell), whose
 * cgroup.procs is read-only but while a pin is placed. The pin is this keeper's
 * child, dies with it (PR_SET_PDEATHSIG) and with the job (cgroup.kill),
 * and is made after a spawn's reply, off the owner's clock, whenever there
 * is none: the first spawn into a job, or the first after a kill_all. */
static void pin_job(void)
{
    if (K.mech != M_CGROUP || K.pin > 0 || K.no_pin || !K.have_clone3 || K.born_killed)
        return;
    char path[4200];
    snprintf(path, sizeof path, "%s/" PIN_DIR, K.cgroup);
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        return;
    int fd = openat(AT_FDCWD, path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    char procs[4300];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", path);
    chmod(procs, 0644); /* read-only but while we place it (a move in needs write access) */
    struct clone_args ca;
    memset(&ca, 0, sizeof ca);
    ca.flags = CLONE_INTO_CGROUP;
    ca.cgroup = (uint64_t)fd;
    ca.exit_signal = SIGCHLD;
    char parent[16];
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    long pid = syscall(SYS_clone3, &ca, sizeof ca); /* a copy of us: returns here */
    if (pid == 0) {
        /* Our own program again, as a fresh process: a copy of this one
         * would keep, private, every page we write after the fork (~80 KiB
         * a job). PR_SET_PDEATHSIG outlives the exec; the pin checks its
         * parent again (pin_main). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char *argv[] = {"tether-keeper", "pin", parent, NULL}, *envp[] = {NULL};
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(fd);
    chmod(procs, 0444); /* no member hides in here (but root, who can leave any cgroup) */
    if (pid > 0)
        K.pin = (pid_t)pid;
}

/* fd itself when it is at or above base (a target fd number a child's fd
 * map may name), else a close-on-exec copy of it above them all. */
static int lift_fd(int fd, int base)
{
    return fd >= base ? fd : fcntl(fd, F_DUPFD_CLOEXEC, base);
}

/* Close the copies lift_fd made of the first n received fds. */
static void drop_lifted(const int *lifted, const int *fds, int n)
{
    for (int k = 0; k < n; k++)
        if (lifted[k] != fds[k])
            close(lifted[k]);
}

/* A child runs as this keeper (the owner, as of the job's opening): only a
 * sender that runs as the same real uid and gid may start one, whatever its
 * request claims (its "ids", checked before, must be the keeper's: so
 * never other ids than the sender's). Else refused, with the reason; 1 when
 * it may. */
static int sender_may_spawn(void)
{
    char why[512];
    if (!have_sender) {
        reply_error("refused", 0, "the request came without its sender's credentials "
                    "(SCM_CREDENTIALS): the keeper starts nothing for a sender it cannot "
                    "name", NULL);
        return 0;
    }
    static uid_t uid = (uid_t)-1;
    static gid_t gid;
    if (uid == (uid_t)-1) /* ours never change: read once */
        uid = getuid(), gid = getgid();
    if (sender.uid != uid || sender.gid != gid) {
        snprintf(why, sizeof why,
                 "the request's sender (pid %d) runs as uid %u gid %u, the job's keeper as "
                 "uid %u gid %u: it would start the child with more privilege than its "
                 "sender has; open a job of its own in the process that changed user",
                 (int)sender.pid, (unsigned)sender.uid, (unsigned)sender.gid, (unsigned)uid,
                 (unsigned)gid);
        reply_error("refused", 0, why, NULL);
        return 0;
    }
    return 1;
}

static void op_spawn(reader *r, const value *msg, int *fds, int nfds)
{
    struct spawn_req *q = arena_alloc(r, sizeof *q);
    if (!q) {
        reply_error("ValueError", 0, "spawn request too large", NULL);
        return;
    }
    memset(q, 0, sizeof *q);
    const value *argv = dict_get(msg, "argv"), *envd = dict_get(msg, "env");
    const value *path = dict_get(msg, "path"), *fdmap = dict_get(msg, "fdmap");
    const value *ids = dict_get(msg, "ids");
    if (ids && ids->t == V_LIST && ids->len == 4) {
        /* a keeper that is no longer who the owner is starts nothing */
        static int64_t want[4] = {-1, -1, -1, -1}; /* ours never change: read once */
        if (want[0] < 0) {
            want[0] = getuid(), want[1] = geteuid(), want[2] = getgid(), want[3] = getegid();
        }
        for (int k = 0; k < 4; k++)
            if (ids->items[k]->t != V_INT || ids->items[k]->i != want[k]) {
                char why[512];
                long long got[4];
                for (int j = 0; j < 4; j++)
                    got[j] = ids->items[j]->t == V_INT ? (long long)ids->items[j]->i : -1;
                snprintf(why, sizeof why,
                         "this process now runs as uid/euid/gid/egid %lld/%lld/%lld/%lld, not as "
                         "the job's keeper (%lld/%lld/%lld/%lld, since the job opened): it would "
                         "start the child as the wrong user; open the job after changing user",
                         got[0], got[1], got[2], got[3], (long long)want[0], (long long)want[1],
                         (long long)want[2], (long long)want[3]);
                reply_error("refused", 0, why, NULL);
                return;
            }
    }
    /* (after that check: an owner that changed user is told so in its words) */
    if (!sender_may_spawn())
        return;
    q->exe = dup_cstr(r, dict_get(msg, "executable"));
    int env_same = dict_true(msg, "env_same");
    if (!argv || argv->t != V_LIST || !q->exe ||
        (env_same ? envd != NULL : !envd || envd->t != V_DICT)) {
        reply_error("ValueError", 0, "malformed spawn request", NULL);
        return;
    }
    if (env_same && !saved_env) {
        reply_error("ValueError", 0, "malformed spawn request: env_same, but no environment "
                    "was sent before", NULL);
        return;
    }
    size_t nenv = env_same ? 0 : envd->len;
    char **av = arena_alloc(r, (argv->len + 1) * sizeof(char *));
    char **ev = arena_alloc(r, (nenv + 1) * sizeof(char *));
    size_t np = path && path->t == V_LIST ? path->len : 0;
    char **pv = arena_alloc(r, (np + 1) * sizeof(char *));
    if (!av || !ev || !pv) {
        reply_error("ValueError", 0, "spawn request too large", NULL);
        return;
    }
    for (size_t k = 0; k < argv->len; k++) {
        av[k] = dup_cstr(r, argv->items[k]);
        if (!av[k]) {
            reply_error("ValueError", 0, "embedded null byte", NULL);
            return;
        }
    }
    av[argv->len] = NULL;
    for (size_t k = 0; k < nenv; k++) {
        const value *kk = envd->items[2 * k], *vv = envd->items[2 * k + 1];
        if (!kk || !vv || (kk->t != V_BYTES && kk->t != V_STR) ||
            (vv->t != V_BYTES && vv->t != V_STR) || memchr(kk->s, '\0', kk->len) ||
            memchr(vv->s, '\0', vv->len) || memchr(kk->s, '=', kk->len)) {
            reply_error("ValueError", 0, "embedded null byte or bad name in the environment",
                        NULL);
            return;
        }
        char *e = arena_alloc(r, kk->len + vv->len + 2);
        if (!e) {
            reply_error("ValueError", 0, "environment too large", NULL);
            return;
        }
        memcpy(e, kk->s, kk->len);
        e[kk->len] = '=';
        memcpy(e + kk->len + 1, vv->s, vv->len);
        e[kk->len + 1 + vv->len] = '\0';
        ev[k] = e;
    }
    ev[nenv] = NULL;
    /* (the owner's own, only: a forked child's channel always sends its own) */
    if (!env_same && serving_chan < 0 && save_env(ev, nenv) < 0) {
        reply_error("os", ENOMEM, NULL, NULL);
        return;
    }
    for (size_t k = 0; k < np; k++)
        pv[k] = dup_cstr(r, path->items[k]) ? dup_cstr(r, path->items[k]) : (char *)"";
    pv[np] = NULL;
    q->argv = av;
    q->envp = env_same ? saved_env : ev;
    q->path = pv;
    const value *cwd = dict_get(msg, "cwd");
    q->cwd = cwd && cwd->t != V_NONE ? dup_cstr(r, cwd) : NULL;
    if (cwd && cwd->t != V_NONE && !q->cwd) {
        /* (not the owner's cwd instead, which no cwd at all would mean) */
        reply_error("ValueError", 0, "embedded null byte", NULL);
        return;
    }
    q->cwd_fd = -1;
    if (!q->cwd) {
        int64_t k = dict_int(msg, "cwd_fd", -1);
        if (k >= 0 && k < nfds)
            q->cwd_fd = fds[k];
    }
    /* fds: lift every source above every target, then map */
    int base = 3;
    if (fdmap && fdmap->t == V_DICT)
        for (size_t k = 0; k < fdmap->len; k++)
            if (fdmap->items[2 * k]->t == V_INT && fdmap->items[2 * k]->i + 1 > base &&
                fdmap->items[2 * k]->i < 1 << 20) /* a bigger one is refused below */
                base = (int)fdmap->items[2 * k]->i + 1;
    int lifted[MAX_FDS];
    int nlifted = 0;
    int own_cwd = -1; /* the owner's cwd, opened here (owner_state) */
    for (int k = 0; k < nfds; k++) {
        /* (already above every target, as received fds usually are: as is) */
        lifted[k] = lift_fd(fds[k], base);
        nlifted++;
        if (lifted[k] < 0) {
            int err = errno;
            drop_lifted(lifted, fds, k);
            reply_error("os", err, NULL, NULL);
            return;
        }
    }
    if (q->cwd_fd >= 0)
        for (int k = 0; k < nfds; k++)
            if (fds[k] == q->cwd_fd)
                q->cwd_fd = lifted[k];
    if (fdmap && fdmap->t == V_DICT)
        for (size_t k = 0; k < fdmap->len; k++) {
            const value *t = fdmap->items[2 * k], *i = fdmap->items[2 * k + 1];
            if (t->t != V_INT || i->t != V_INT || i->i < 0 || i->i >= nfds || t->i < 0 ||
                t->i > 1 << 20 || q->nmap == MAX_FDS) {
                drop_lifted(lifted, fds, nlifted);
                reply_error("ValueError", 0, "malformed spawn request: a bad fd map", NULL);
                return;
            }
            q->map_src[q->nmap] = lifted[i->i];
            q->map_dst[q->nmap] = (int)t->i;
            q->nmap++;
        }
    q->close_unmapped_std = 1;
    q->setsid_ = dict_true(msg, "setsid");
    int64_t pg = dict_int(msg, "pgroup", -1);
    q->pgroup = pg == -1 ? (pid_t)dict_int(msg, "owner_pgid", -1) : (pid_t)pg;
    if (K.mech == M_PIDNS && !q->setsid_)
        q->pgroup = 0; /* the owner's group is not visible inside the namespace */
    sigemptyset(&q->mask);
    const value *sm = dict_get(msg, "sigmask");
    if (sm && sm->t == V_LIST)
        for (size_t k = 0; k < sm->len; k++)
            if (sm->items[k]->t == V_INT && sm->items[k]->i > 0 && sm->items[k]->i < 65)
                sigaddset(&q->mask, (int)sm->items[k]->i);
    const value *ig = dict_get(msg, "ignored");
    if (ig && ig->t == V_LIST)
        for (size_t k = 0; k < ig->len; k++)
            if (ig->items[k]->t == V_INT && ig->items[k]->i > 0 && ig->items[k]->i < 65 &&
                ig->items[k]->i != SIGCHLD)
                q->ign[ig->items[k]->i] = 1;
    q->umask_ = (int)dict_int(msg, "umask", -1);
    q->ctty = dict_true(msg, "ctty");
    const value *rl = dict_get(msg, "rlimits");
    if (dict_true(msg, "owner_state")) {
        const char *bad = NULL;
        char why[160];
        if (ig || rl) {
            bad = "ValueError";
            snprintf(why, sizeof why, "malformed spawn request: owner_state, and the owner's "
                     "state in it");
        } else if (read_owner_state(q, dict_true(msg, "restore_signals"), q->umask_ < 0) < 0) {
            bad = "owner_state";
            snprintf(why, sizeof why, "cannot read the owner's signals, umask and limits from "
                     "/proc/%d: %s", (int)K.owner, strerror(errno));
        } else if (!q->cwd && q->cwd_fd < 0) {
            /* the owner's working directory itself (deleted or not), above
             * every target fd, as the owner would have passed it */
            char path[64];
            snprintf(path, sizeof path, "/proc/%d/cwd", (int)K.owner);
            int fd = openat(AT_FDCWD, path, O_PATH | O_DIRECTORY | O_CLOEXEC);
            int up = fd >= 0 ? lift_fd(fd, base) : -1, err = errno;
            if (up != fd && fd >= 0)
                close(fd);
            fd = up;
            errno = err; /* openat's or fcntl's, for the message below */
            if (fd < 0) {
                bad = "owner_state";
                snprintf(why, sizeof why, "cannot open the owner's working directory %s: %s",
                         path, strerror(errno));
            }
            q->cwd_fd = own_cwd = fd;
        }
        if (bad) {
            drop_lifted(lifted, fds, nlifted);
            reply_error(bad, 0, why, NULL);
            return;
        }
    } else if (rl && rl->t == V_LIST)
        for (size_t k = 0; k < rl->len && q->nlim < 16; k++) {
            const value *t = rl->items[k];
            if (t->t == V_LIST && t->len == 3 && t->items[0]->t == V_INT &&
                t->items[1]->t == V_INT && t->items[2]->t == V_INT) {
                rlim_t cur = t->items[1]->i < 0 ? RLIM_INFINITY : (rlim_t)t->items[1]->i;
                rlim_t max = t->items[2]->i < 0 ? RLIM_INFINITY : (rlim_t)t->items[2]->i;
                want_limit(q, (int)t->items[0]->i, cur, max);
            }
        }
    int pidfd = -1;
    unsigned char b[6];
    ssize_t n = 0;
    int nproc = take_nproc(q);
    pid_t pid = spawn_followed(q, &pidfd, b, &n);
    int err = errno;
    if (nproc)
        setrlimit(RLIMIT_NPROC, &K.lim[RLIMIT_NPROC]);
    drop_lifted(lifted, fds, nlifted);
    if (own_cwd >= 0)
        close(own_cwd);
    if (pid < 0) {
        if (K.mech == M_CGROUP &&
            (err == EACCES || err == EPERM || err == EBUSY || err == EOPNOTSUPP || err == ENOENT)) {
            char why[256];
            snprintf(why, sizeof why, "cannot place the child in the job: %s", strerror(err));
            reply_error("refused", 0, why, NULL);
        } else
            reply_error("os", err, NULL, NULL);
        return;
    }
    if (n == 0) { /* killed at birth on the old path too: the job is being killed */
        int st;
        while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR) {
        }
        if (pidfd >= 0)
            close(pidfd);
        reply_error("refused", 0, "the child was killed at birth: the job is being ended", NULL);
        return;
    }
    if (n == (ssize_t)sizeof b) { /* "a", then the stage and errno where it failed */
        int cerr = (int)b[2] | ((int)b[3] << 8) | ((int)b[4] << 16) | ((int)b[5] << 24);
        int st;
        while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR) {
        }
        if (pidfd >= 0)
            close(pidfd);
        char why[256];
        if (b[1] == 'g') {
            snprintf(why, sizeof why, "cannot place the child in the job: %s", strerror(cerr));
            reply_error("refused", 0, why, NULL);
        } else if (b[1] == 'r') {
            snprintf(why, sizeof why, "cannot give the child this process's resource limits: %s",
                     strerror(cerr));
            reply_error("os", cerr, why, NULL);
        } else {
            /* as subprocess names them: the cwd (None when it was passed as
             * a directory fd), else the executable as given */
            const char *fname = b[1] == 'c' ? q->cwd : b[1] == 'e' ? q->exe : NULL;
            reply_error("os", cerr, NULL, fname);
        }
        return;
    }
    if (K.nkids < MAX_CHILDREN)
        K.kids[K.nkids++] = pid;
    if (serving_chan >= 0) { /* its exit goes to that channel (if there is no room: kept here) */
        if (nckids == ckids_cap) {
            size_t cap = ckids_cap ? ckids_cap * 2 : 64;
            struct ckid *more = realloc(ckids, cap * sizeof *ckids);
            if (more) {
                ckids = more;
                ckids_cap = cap;
            }
        }
        if (nckids < ckids_cap)
            ckids[nckids++] = (struct ckid){pid, serving_chan};
    }
    writer *w = wbegin();
    w_dict(w);
    w_key(w, "ok");
    w_bool(w, 1);
    w_key(w, "pid");
    w_int(w, pid);
    if (dict_true(msg, "ident"))
        write_ident(w, pid, pidfd);
    w_end(w);
    send_msg(w, pidfd >= 0 ? &pidfd : NULL, pidfd >= 0, 0);
    if (pidfd >= 0)
        close(pidfd);
    if (!K.background) /* (its keeper reaps until the job is empty, pin or not) */
        pin_job();
}

/* ------------------------------------------------------------------------ */
/* requests                                                                 */

static void pass_creds(int fd);
static char arena[4 << 20];

/* One request; 1 when the job is closed and the keeper leaves. */
/* A spawn's sources beyond the fds it carried, for a peer that cannot pass
 * fds (docs/protocol.md): "inherit", fds this keeper was given at start
 * (keep=), and "open", files it opens, [path, "r"|"w"|"a"|"r+"]; each is
 * appended to fds (room for MAX_FDS), in that order, for the fdmap to
 * name. 0, or -1 with the error replied. */
static int add_sources(const value *msg, int *fds, int *nfds)
{
    const value *inh = dict_get(msg, "inherit"), *opn = dict_get(msg, "open");
    if ((inh && inh->t != V_LIST) || (opn && opn->t != V_LIST) ||
        *nfds + (inh ? (int)inh->len : 0) + (opn ? (int)opn->len : 0) > MAX_FDS) {
        reply_error("ValueError", 0, "malformed spawn request: bad inherit or open", NULL);
        return -1;
    }
    for (size_t k = 0; inh && k < inh->len; k++) {
        const value *v = inh->items[k];
        int ok = 0;
        for (int j = 0; v->t == V_INT && j < K.nkeep; j++)
            ok |= K.keep[j] == v->i;
        if (!ok) {
            reply_error("ValueError", 0, "inherit: not an fd this keeper was given (keep=)", NULL);
            return -1;
        }
        int fd = fcntl((int)v->i, F_DUPFD_CLOEXEC, 3);
        if (fd < 0) {
            reply_error("os", errno, NULL, NULL);
            return -1;
        }
        fds[(*nfds)++] = fd;
    }
    static const struct { const char *mode; int flags; } modes[] = {
        {"r", O_RDONLY}, {"w", O_WRONLY | O_CREAT | O_TRUNC}, {"a", O_WRONLY | O_CREAT | O_APPEND},
        {"r+", O_RDWR}};
    for (size_t k = 0; opn && k < opn->len; k++) {
        const value *v = opn->items[k];
        char path[4096];
        int flags = -1;
        if (v->t == V_LIST && v->len == 2 && (v->items[0]->t == V_STR || v->items[0]->t == V_BYTES) &&
            v->items[0]->len < sizeof path && !memchr(v->items[0]->s, 0, v->items[0]->len) &&
            v->items[1]->t == V_STR)
            for (size_t m = 0; m < sizeof modes / sizeof *modes; m++)
                if (v->items[1]->len == strlen(modes[m].mode) &&
                    memcmp(v->items[1]->s, modes[m].mode, v->items[1]->len) == 0)
                    flags = modes[m].flags;
        if (flags < 0) {
            reply_error("ValueError", 0, "malformed spawn request: open wants [path, mode]", NULL);
            return -1;
        }
        memcpy(path, v->items[0]->s, v->items[0]->len);
        path[v->items[0]->len] = '\0';
        int fd = open(path, flags | O_CLOEXEC | O_NOCTTY, 0666);
        if (fd < 0) {
            reply_error("os", errno, NULL, path);
            return -1;
        }
        fds[(*nfds)++] = fd;
    }
    return 0;
}

static int handle(const unsigned char *data, size_t len, int *fds, int nfds)
{
    reader r = {.p = data, .end = data + len, .arena = arena, .cap = sizeof arena};
    value *msg = rd_value(&r, 0);
    int done = 0;
    if (!msg || r.bad || msg->t != V_DICT || r.p != r.end) { /* one map, nothing after */
        reply_error("ValueError", 0, "malformed request", NULL);
        goto out;
    }
    /* a big payload travels in a memfd: {"_memfd": size} + the fd, last */
    const value *mf = dict_get(msg, "_memfd");
    static char *big;
    if (mf && mf->t == V_INT && nfds > 0) {
        size_t size = (size_t)mf->i;
        int mfd = fds[--nfds];
        struct stat sb;
        if (fstat(mfd, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size < mf->i || mf->i < 0) {
            /* a pipe would block this keeper for good: a memfd (a file) only */
            close(mfd);
            reply_error("ValueError", 0, "truncated memfd payload (or not a memfd)", NULL);
            goto out;
        }
        free(big);
        big = size < (1u << 30) ? malloc(size ? size : 1) : NULL;
        size_t got = 0;
        while (big && got < size) {
            ssize_t n = read(mfd, big + got, size - got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        close(mfd);
        if (!big || got != size) {
            reply_error("ValueError", 0, "truncated memfd payload", NULL);
            goto out;
        }
        static char *big_arena;
        static size_t big_cap;
        size_t want = size * 8 + (1 << 20);
        if (want > big_cap) {
            free(big_arena);
            big_arena = malloc(want);
            big_cap = big_arena ? want : 0;
        }
        if (!big_arena) {
            reply_error("ValueError", 0, "payload too large", NULL);
            goto out;
        }
        r = (reader){.p = (unsigned char *)big, .end = (unsigned char *)big + size,
                     .arena = big_arena, .cap = big_cap};
        msg = rd_value(&r, 0);
        if (!msg || r.bad || msg->t != V_DICT || r.p != r.end) { /* one map, nothing after */
            reply_error("ValueError", 0, "malformed request", NULL);
            goto out;
        }
    }
    const value *op = dict_get(msg, "op");
    if (!op || op->t != V_STR) {
        reply_error("ValueError", 0, "request without an op", NULL);
        goto out;
    }
#define IS(name) (op->len == strlen(name) && memcmp(op->s, name, op->len) == 0)
    if (IS("spawn")) {
        if (add_sources(msg, fds, &nfds) == 0)
            op_spawn(&r, msg, fds, nfds);
    } else if (IS("wait") || IS("poll")) {
        pid_t pid = (pid_t)dict_int(msg, "pid", 0);
        int st = 0, have = 0;
        reap_all(1);
        have = take_status(pid, &st);
        if (!have && IS("wait") && is_kid(pid)) {
            while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR) {
            }
            drop_kid(pid);
            have = 1;
        }
        writer *w = wbegin();
        w_dict(w);
        w_key(w, "ok");
        w_bool(w, 1);
        w_key(w, "status");
        if (have)
            w_int(w, st);
        else
            w_none(w);
        w_end(w);
        send_msg(w, NULL, 0, 0);
    } else if (IS("kill_all")) {
        kill_all(dict_seconds(msg, "timeout", KILL_BOUND));
        reply_ok();
    } else if (IS("close")) {
        kill_all(dict_seconds(msg, "timeout", KILL_BOUND));
        cleanup();
        writer *w = wbegin();
        w_dict(w);
        w_key(w, "ok");
        w_bool(w, 1);
        w_key(w, "status");
        w_dict(w);
        for (size_t k = 0; k < K.ndone; k++) {
            w_int(w, K.done_pid[k]);
            w_int(w, K.done_st[k]);
        }
        w_end(w);
        w_end(w);
        send_msg(w, NULL, 0, 0);
        done = 1;
    } else if (IS("step_aside")) {
        reply_ok(); /* this keeper never lives inside the job's cgroup */
    } else if (IS("ping")) {
        writer *w = wbegin();
        w_dict(w);
        w_key(w, "ok");
        w_bool(w, 1);
        w_key(w, "keeper");
        w_int(w, getpid());
        w_end(w);
        send_msg(w, NULL, 0, 0);
    } else if (IS("channel")) {
        /* A forked child of the owner asks for a channel of its own (the
         * socket it sends): its requests, replies and its children's exits
         * go there, never crossing its parent's. The answer goes there too. */
        int type = 0;
        socklen_t tl = sizeof type;
        if (nfds < 1 || getsockopt(fds[0], SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
            type != SOCK_STREAM) {
            reply_error("ValueError", 0, "channel: no stream socket", NULL);
        } else if (nchans >= MAX_CHANS) {
            reply_error("ValueError", 0, "channel: too many", NULL);
        } else {
            chans[nchans++] = fds[0];
            fcntl(fds[0], F_SETFD, FD_CLOEXEC);
            pass_creds(fds[0]); /* before the answer, which the child waits for */
            int ctl = K.ctl;
            K.ctl = fds[0];
            fds[0] = -1; /* kept */
            reply_ok();
            K.ctl = ctl;
        }
    } else {
        reply_error("ValueError", 0, "unknown request", NULL);
    }
#undef IS
out:
    for (int k = 0; k < nfds; k++)
        close(fds[k]);
    return done;
}

/* Every message on fd carries its sender's credentials, filled in and
 * checked by the kernel at each send (see sender). */
static void pass_creds(int fd)
{
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
}

/* What has come of the frame being read on one channel: the stream is
 * read frame by frame, never past the end of the current one, so the fds
 * that rode on a frame's first bytes are that frame's. Never blocks: a peer
 * that sends half a frame holds only its own channel. */
struct inbox {
    unsigned char head[4];
    size_t hgot;         /* bytes of head */
    uint32_t len;        /* the body's, once head is whole */
    size_t got;          /* bytes of body read (or skipped: too long) */
    int fds[MAX_FDS];
    int nfds;
    const char *why;     /* set: the frame is refused whole once read */
    struct ucred cred;   /* its sender, as the kernel vouches for it (SCM_CREDENTIALS) */
    int have_cred;
    unsigned char *body; /* MAX_MSG bytes */
};

static unsigned char ctl_body[MAX_MSG];
static struct inbox ctl_in = {.body = ctl_body};
static struct inbox *chan_in[MAX_CHANS];

static void inbox_reset(struct inbox *in)
{
    for (int k = 0; k < in->nfds; k++)
        close(in->fds[k]);
    in->hgot = in->got = 0;
    in->len = 0;
    in->nfds = 0;
    in->why = NULL;
    in->have_cred = 0;
}

/* Why fds that came did not all arrive (MSG_CTRUNC): too many, or no room
 * for them here (a low ulimit -n is not a malformed request). */
static const char *fds_lost(int fd)
{
    static char why[200];
    snprintf(why, sizeof why, "more file descriptors than a request may carry");
    int probe = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    int full = probe < 0 && errno == EMFILE;
    struct rlimit nofile;
    if (probe >= 0)
        close(probe);
    if (full && getrlimit(RLIMIT_NOFILE, &nofile) == 0)
        snprintf(why, sizeof why, "the request's file descriptors could not be taken: the "
                 "keeper is at its open-file limit (RLIMIT_NOFILE %llu)",
                 (unsigned long long)nofile.rlim_cur);
    return why;
}

/* The sender of the bytes just read: a stream read never spans two
 * senders' writes (the kernel stops at a change of credentials), but a frame
 * may span two reads, and all of it must come from one sender. */
static void frame_sender(struct inbox *in, const unsigned char *data)
{
    struct ucred c;
    memcpy(&c, data, sizeof c);
    if (!in->have_cred) {
        in->cred = c;
        in->have_cred = 1;
    } else if ((c.pid != in->cred.pid || c.uid != in->cred.uid || c.gid != in->cred.gid) &&
               !in->why) {
        in->why = "a frame written by two processes";
    }
}

/* One read of the current frame: -1 nothing more now, 0 progress, 1 the
 * channel closed (its process is gone). */
static int inbox_read(int fd, struct inbox *in)
{
    static unsigned char skip[4096];
    unsigned char *to;
    size_t want;
    if (in->hgot < 4) {
        to = in->head + in->hgot;
        want = 4 - in->hgot;
    } else {
        want = in->len - in->got;
        to = in->why ? skip : in->body + in->got;
        if (in->why && want > sizeof skip)
            want = sizeof skip;
    }
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {to, want};
    struct msghdr mh = {0};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    ssize_t got = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0)
        return errno == EAGAIN || errno == EINTR ? -1 : 1;
    /* musl's CMSG_NXTHDR compares a size_t with a ptrdiff_t; clang (zig cc, the
     * aarch64 wheel's compiler) warns at the expansion site, in our code */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct ucred)) && got > 0)
            frame_sender(in, CMSG_DATA(c));
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int cnt = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int k = 0; k < cnt; k++) {
                int one;
                memcpy(&one, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
                if (in->nfds < MAX_FDS)
                    in->fds[in->nfds++] = one;
                else
                    close(one), in->why = "more file descriptors than a request may carry";
            }
        }
    }
#pragma GCC diagnostic pop
    if (mh.msg_flags & MSG_CTRUNC)
        in->why = fds_lost(fd);
    if (got == 0)
        return 1; /* EOF: a stream has no empty messages */
    if (in->hgot < 4) {
        in->hgot += (size_t)got;
        if (in->hgot == 4) {
            in->len = (uint32_t)in->head[0] << 24 | (uint32_t)in->head[1] << 16 |
                      (uint32_t)in->head[2] << 8 | in->head[3];
            if (in->len > MAX_MSG && !in->why)
                in->why = "request larger than a message may be"; /* read, and dropped */
        }
    } else {
        in->got += (size_t)got;
    }
    return 0;
}

/* One frame from owner channel fd (K.ctl is that channel meanwhile), if
 * one is whole; 1 when that channel has closed (its process is gone). */
static int serve_one(int fd, struct inbox *in)
{
    for (;;) {
        int r = inbox_read(fd, in);
        if (r == 1) {
            inbox_reset(in);
            return 1;
        }
        if (r < 0)
            return 0;
        if (in->hgot < 4 || in->got < in->len)
            continue;
        int nfds = in->nfds;
        in->nfds = 0; /* handle() closes them */
        if (in->why) {
            for (int k = 0; k < nfds; k++)
                close(in->fds[k]);
            reply_error("ValueError", 0, in->why, NULL);
        } else {
            sender = in->cred;
            have_sender = in->have_cred;
            if (handle(in->body, in->len, in->fds, nfds))
                _exit(0);
        }
        inbox_reset(in);
        return 0;
    }
}

/* A forked child's channel closed: drop it; its children's exits are kept. */
static void drop_chan(size_t i)
{
    int fd = chans[i];
    close(fd);
    if (chan_in[i])
        inbox_reset(chan_in[i]);
    free(chan_in[i]);
    chan_in[i] = chan_in[nchans - 1];
    chan_in[nchans - 1] = NULL;
    chans[i] = chans[--nchans];
    for (size_t k = 0; k < nckids; k++)
        if (ckids[k].chan == fd)
            ckids[k].chan = -1;
}

#define PF_EXITING_ 0x4 /* include/linux/sched.h: not in the uapi headers */

/* /proc/OWNER, opened at the start while the owner was alive: read by the
 * beacon's waiter and by owner_execd */
static int beacon_proc = -1;

/* 1 when every thread of the owner is exiting or gone, else 0. */
static int owner_exiting(void)
{
    struct dir_walk w;
    if (dir_open_at(&w, beacon_proc, "task") < 0)
        return errno == ENOENT || errno == ESRCH; /* reaped: gone */
    int all = 1;
    const struct dent64 *d;
    while (all && (d = dir_next(&w))) {
        if (d->name[0] == '.')
            continue;
        char path[300], buf[1024];
        snprintf(path, sizeof path, "%s/stat", d->name);
        ssize_t n = read_file_at(w.fd, path, buf, sizeof buf);
        if (n <= 0) {
            all = n < 0 && (errno == ENOENT || errno == ESRCH); /* that thread is gone */
            continue;
        }
        /* field 9 is the flags, 31 the thread's pending signals (SIGKILL's
         * bit: every thread gets it at a group exit or a kill -9, before its
         * own exit starts) */
        const char *flags = stat_field(buf, 9), *pending = stat_field(buf, 31);
        if (!flags || !pending || (!(strtoull(flags, NULL, 10) & PF_EXITING_) &&
                                   !(strtoull(pending, NULL, 10) & (1ULL << (SIGKILL - 1)))))
            all = 0;
    }
    close(w.fd);
    return all;
}

/* After the owner's end of the socket closed: 1 when the owner lives on
 * (an exec), 0 when it is dying or gone. Its exit closes its files after
 * every thread is marked exiting, so a live owner none of whose threads is
 * exiting has exec'd. Unknown (no /proc of it): gone, as before. */
static int owner_execd(void)
{
    if (K.ownerfd >= 0) {
        struct pollfd o = {K.ownerfd, POLLIN, 0};
        if (poll(&o, 1, 0) != 0)
            return 0;
    } else if (kill(K.owner, 0) < 0 && errno == ESRCH) {
        return 0;
    }
    return beacon_proc >= 0 && !owner_exiting();
}

static void serve(void) __attribute__((noreturn));
static void serve(void)
{
    /* (poll skips an entry whose fd is -1) */
    struct pollfd p[4 + MAX_CHANS] = {{K.ctl, POLLIN, 0}, {K.sigfd, POLLIN, 0},
                                      {K.ownerfd, POLLIN, 0}, {K.beacon_event, POLLIN, 0}};
    for (;;) {
        size_t nch = nchans;
        for (size_t i = 0; i < nch; i++)
            p[4 + i] = (struct pollfd){chans[i], POLLIN, 0};
        int n = poll(p, 4 + nch, K.ownerfd >= 0 ? -1 : 200);
        if (n < 0 && errno != EINTR)
            end_for_dead_owner();
        if (K.ownerfd >= 0 && (p[2].revents & (POLLIN | POLLHUP | POLLERR)))
            end_for_dead_owner();
        if (p[3].revents & POLLIN)
            end_for_dead_owner(); /* every thread of the owner is exiting: see beacon_wait */
        if (K.ownerfd < 0 && (kill(K.owner, 0) < 0 && errno == ESRCH))
            end_for_dead_owner(); /* no pidfd: the owner watched by polling */
        if (p[1].revents & POLLIN) {
            drain_sigfd();
            reap_all(1);
        }
        if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && serve_one(K.ctl, &ctl_in)) {
            /* The owner's end closed: it is gone, or it called execve (its
             * sockets are close-on-exec) and lives on. The job lives as long
             * as the process: from now on its pidfd (or polling) alone says
             * when it dies. */
            if (!owner_execd())
                end_for_dead_owner();
            close(K.ctl);
            K.ctl = p[0].fd = -1;
        }
        for (size_t i = nch; i-- > 0;) {
            if (!(p[4 + i].revents & (POLLIN | POLLHUP | POLLERR)) || i >= nchans ||
                chans[i] != p[4 + i].fd)
                continue;
            int ctl = K.ctl;
            K.ctl = serving_chan = chans[i];
            if (!chan_in[i]) { /* (its buffer: made when it first speaks) */
                chan_in[i] = malloc(sizeof(struct inbox) + MAX_MSG);
                if (chan_in[i]) {
                    memset(chan_in[i], 0, sizeof(struct inbox));
                    chan_in[i]->body = (unsigned char *)(chan_in[i] + 1);
                }
            }
            int gone = !chan_in[i] || serve_one(K.ctl, chan_in[i]);
            K.ctl = ctl;
            serving_chan = -1;
            if (gone)
                drop_chan(i);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* set-up                                                                   */

static void ready(pid_t outer)
{
    writer *w = wbegin();
    w_dict(w);
    if (outer) {
        w_key(w, "outer");
        w_int(w, outer);
    } else {
        w_key(w, "ready");
        w_bool(w, 1);
        w_key(w, "keeper");
        w_int(w, getpid());
        w_key(w, "native");
        w_bool(w, 1);
        w_key(w, "protocol");
        w_int(w, TETHER_PROTOCOL_VERSION);
        w_key(w, "constants"); /* every shared constant: docs/protocol.md */
        w_dict(w);
#define HELLO_INT(name, v) w_key(w, name), w_int(w, v);
#define HELLO_FLOAT(name, v) w_key(w, name), w_float(w, v);
#define HELLO_TEXT(name, v) w_key(w, name), w_str(w, v);
        TETHER_CONSTANTS(HELLO_INT, HELLO_FLOAT, HELLO_TEXT)
#undef HELLO_INT
#undef HELLO_FLOAT
#undef HELLO_TEXT
        w_end(w);
        w_key(w, "trace");
        w_dict(w);
        if (K.mech == M_CGROUP) {
            w_key(w, "cgroup_path");
            w_str(w, K.cgroup);
        }
        w_key(w, "owner_watch");
        w_str(w, K.ownerfd < 0 ? "poll" : K.beacon_event >= 0 ? "pidfd+beacon" : "pidfd");
        w_end(w);
    }
    w_end(w);
    send_msg(w, NULL, 0, 0);
}

static void refuse(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void refuse(const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    writer *w = wbegin();
    w_dict(w);
    w_key(w, "ready");
    w_bool(w, 0);
    w_key(w, "error");
    w_str(w, text);
    w_end(w);
    send_msg(w, NULL, 0, 0);
    _exit(0);
}

static void enter_pidns(void)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (uid == 0) {
        if (unshare(CLONE_NEWPID) < 0)
            refuse("unshare(CLONE_NEWPID): %s", strerror(errno));
    } else {
        if (unshare(CLONE_NEWUSER | CLONE_NEWPID) < 0)
            refuse("unshare(CLONE_NEWUSER|CLONE_NEWPID): %s", strerror(errno));
        char map[64];
        write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "%u %u 1", (unsigned)uid, (unsigned)uid);
        if (write_file("/proc/self/uid_map", map) < 0)
            refuse("uid_map: %s", strerror(errno));
        snprintf(map, sizeof map, "%u %u 1", (unsigned)gid, (unsigned)gid);
        if (write_file("/proc/self/gid_map", map) < 0)
            refuse("gid_map: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0)
        refuse("fork into the namespace: %s", strerror(errno));
    if (pid > 0) { /* the intermediate: report the init's outer pid, and go */
        ready(pid);
        _exit(0);
    }
    if (getpid() != 1)
        refuse("the namespace's keeper is not PID 1");
}

static void close_span(unsigned lo, unsigned hi)
{
    if (lo > hi)
        return;
    if (syscall(SYS_close_range, lo, hi, 0) == 0)
        return;
    /* Linux < 5.9: the ones /proc says are open */
    struct dir_walk w;
    if (dir_open(&w, "/proc/self/fd") < 0)
        return;
    int fds[1024];
    int n = 0;
    for (const struct dent64 *d; (d = dir_next(&w));) {
        char *e;
        long fd = strtol(d->name, &e, 10);
        if (*e == '\0' && e != d->name && fd != w.fd && (unsigned long)fd >= lo &&
            (unsigned long)fd <= hi && n < 1024)
            fds[n++] = (int)fd;
    }
    close(w.fd);
    for (int k = 0; k < n; k++)
        close(fds[k]);
}

/* Close every fd above 2 but the n in keep (-1 entries: none). No
 * allocation and no libc state: a vfork-style child calls it too. */
static void close_all_except(const int *keep, int n)
{
    unsigned lo = 3;
    for (;;) { /* each time: the lowest kept fd at or above lo */
        int next = -1;
        for (int k = 0; k < n; k++)
            if (keep[k] >= 0 && (unsigned)keep[k] >= lo && (next < 0 || keep[k] < next))
                next = keep[k];
        if (next < 0) {
            close_span(lo, ~0U);
            return;
        }
        if ((unsigned)next > lo)
            close_span(lo, (unsigned)next - 1);
        lo = (unsigned)next + 1;
    }
}

/* Close every fd above 2 but a and b (-1: none). */
static void close_others(int a, int b)
{
    int keep[2] = {a, b};
    close_all_except(keep, 2);
}

/* Close every fd above 2 but the control socket, the owner's pidfd and the
 * kept ones (keep=). */
static void close_all_but(void)
{
    int keep[18], n = 0;
    keep[n++] = K.ctl;
    keep[n++] = K.ownerfd;
    for (int k = 0; k < K.nkeep; k++)
        keep[n++] = K.keep[k];
    close_all_except(keep, n);
}

/* the second driver: one command, reported on a pipe (tether-shell, tether run) */
#include "oneshot.c"

static int usage(void)
{
    static const char text[] =
        "usage: tether-keeper serve MECH CTL_FD OWNER_PID OWNER_PIDFD [cgroup=PATH mount=PATH] "
        "[background=1] [legacy=1] [owner_state=0] [beacon=FD:OFFSET] [keep=FD,...]\n"
        "       tether-keeper one REP_FD CTL_FD OWNER_PIDFD OWNER_PID OWNER_START PGID "
        "auto|cgroup|subreaper GRACE_MS [base=DIR mount=DIR] [caller=FD:PID:START [scope=caller]] "
        "[ign=HEX] [mask=HEX] -- EXE ARGV0 [ARG...]\n"
        "       tether-keeper --version\n"
        "the native keeper of a tether job; tether starts it (see tether/keeper/native.py)\n";
    ssize_t n = write(2, text, sizeof text - 1);
    (void)n;
    return 2;
}

#ifndef TETHER_KEEPER_NO_MAIN /* shell.c includes this file for its own main */
/* ------------------------------------------------------------------------ */
/* the owner's death, told before its memory is unmapped                    */

/* The owner's pidfd becomes readable at the very end of its exit, after the
 * kernel has unmapped its memory: about a millisecond for a Python owner,
 * several for a big one, while the job runs on. Earlier in the same exit
 * (exit_mm -> mm_release) the kernel walks the dying thread's robust-futex
 * list: each mutex on it gets FUTEX_OWNER_DIED in its lock word, and one
 * waiter is woken. The owner's main thread holds such a mutex, in a memfd
 * page, for its whole life (tether/keeper/_beacon.py); a thread of this
 * keeper waits on its lock word, and serve() ends the job when told.
 *
 * The trap: the same walk runs when that thread calls execve, or exits while
 * other threads live on. So the job ends only when every thread of the owner
 * is exiting (PF_EXITING, or a SIGKILL pending, which nothing survives);
 * otherwise the waiter stops and the pidfd alone watches, as without one. */

static uint32_t *beacon_word; /* in the owner's memfd page, mapped here */
/* The waiter tells serve() through a pipe, not an eventfd: a pipe's write
 * wakes the reader as a sync wakeup, which puts it on the writer's CPU, free
 * a moment later when the waiter ends. An eventfd's wakeup could put it
 * behind the owner's own exit on the other CPU (which the kernel does not
 * preempt: 0.6-0.8 ms after the kill instead of 0.2-0.3, 2 trials in 12). */
static int beacon_tell = -1;

/* beacon=FD:OFFSET: map the page, keep nothing of the fd. A page that
 * cannot be mapped leaves the pidfd alone (the trace says which). */
static int beacon_map(const char *spec)
{
    char *end;
    long fd = strtol(spec, &end, 10);
    if (end == spec || *end != ':' || fd < 3 || fd == K.ctl || fd == K.ownerfd)
        return -1;
    const char *at = end + 1;
    long off = strtol(at, &end, 10);
    if (*end || end == at || off < 0 || off > 4092 || off % 4)
        return -1;
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
    close((int)fd);
    if (m != MAP_FAILED)
        beacon_word = (uint32_t *)((char *)m + off);
    return 0;
}

static void *beacon_wait(void *unused)
{
    (void)unused;
    for (;;) {
        uint32_t v = __atomic_load_n(beacon_word, __ATOMIC_ACQUIRE);
        if (v & FUTEX_OWNER_DIED)
            break;
        if (!(v & FUTEX_TID_MASK))
            return NULL; /* not held: there is nothing to be told */
        if (!(v & FUTEX_WAITERS)) {
            if (!__atomic_compare_exchange_n(beacon_word, &v, v | FUTEX_WAITERS, 0,
                                             __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                continue;
            v |= FUTEX_WAITERS;
        }
        /* shared (not FUTEX_PRIVATE): the word is in the owner's memory too;
         * EAGAIN (it changed) and EINTR: look again */
        syscall(SYS_futex, beacon_word, FUTEX_WAIT, v, NULL, NULL, 0);
    }
    /* the kernel woke one waiter: wake every other keeper of this owner */
    syscall(SYS_futex, beacon_word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    if (owner_exiting()) {
        ssize_t n = write(beacon_tell, "", 1);
        (void)n;
    }
    return NULL;
}

/* The waiter thread: every signal blocked in it, so each one still reaches
 * the main thread (its signalfd, or its default action) as before. */
static void beacon_start(void)
{
    if (!beacon_word || beacon_proc < 0)
        return;
    int ends[2];
    if (pipe2(ends, O_CLOEXEC | O_NONBLOCK) < 0)
        return;
    K.beacon_event = ends[0];
    beacon_tell = ends[1];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    sigset_t all, was;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    pthread_t t;
    int rc = pthread_create(&t, &attr, beacon_wait, NULL);
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(K.beacon_event);
        close(beacon_tell);
        K.beacon_event = -1;
        return;
    }
    pthread_detach(t);
}

/* tether-keeper pin PARENT: a job's pin (pin_job), the child of keeper
 * PARENT, asleep until it dies with the keeper (PR_SET_PDEATHSIG, set
 * before the exec that started us and kept by it) or with the job. (A
 * zombie child of its own in the job's cgroup would also keep the kernel's
 * css_set of the job alive, for a spawn after a pause sooner still, but
 * while it lives, for a moment, it is in the job's cgroup.procs: a member
 * to any reader.) */
static int pin_main(const char *parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if ((long)getppid() != strtol(parent, NULL, 10))
        return 0; /* the keeper died before the line above */
    prctl(PR_SET_NAME, "tether-pin", 0, 0, 0);
    close_span(0, ~0U);
    for (;;) /* the keeper's blocked signals stay blocked (exec keeps a mask); SIGKILL ends it */
        pause();
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("tether-keeper 1 (protocol %d: length-prefixed CBOR over a stream socket)\n",
               TETHER_PROTOCOL_VERSION);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "pin") == 0)
        return pin_main(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "one") == 0)
        return one_main(argc, argv);
    if (argc < 6 || strcmp(argv[1], "serve") != 0)
        return usage();
    if (strcmp(argv[2], "cgroup") == 0)
        K.mech = M_CGROUP;
    else if (strcmp(argv[2], "subreaper") == 0)
        K.mech = M_SUBREAPER;
    else if (strcmp(argv[2], "pidns") == 0)
        K.mech = M_PIDNS;
    else
        return usage();
    char *end;
    K.ctl = (int)strtol(argv[3], &end, 10);
    if (*end || K.ctl < 0)
        return usage();
    K.owner = (pid_t)strtol(argv[4], &end, 10);
    if (*end || K.owner <= 0)
        return usage();
    K.ownerfd = (int)strtol(argv[5], &end, 10);
    if (*end)
        return usage();
    K.cgfd = -1;
    K.beacon_event = -1;
    for (int k = 6; k < argc; k++) {
        if (strncmp(argv[k], "cgroup=", 7) == 0)
            snprintf(K.cgroup, sizeof K.cgroup, "%s", argv[k] + 7);
        else if (strncmp(argv[k], "mount=", 6) == 0)
            snprintf(K.mount, sizeof K.mount, "%s", argv[k] + 6);
        else if (strcmp(argv[k], "background=1") == 0)
            K.background = 1;
        else if (strcmp(argv[k], "legacy=1") == 0)
            K.legacy = 1;
        else if (strcmp(argv[k], "owner_state=0") == 0)
            K.no_owner_state = 1;
        else if (strncmp(argv[k], "keep=", 5) == 0) {
            /* fds for children, named by a spawn's "inherit" (a peer that
             * cannot pass fds: docs/protocol.md) */
            for (char *p = argv[k] + 5; *p;) {
                long fd = strtol(p, &end, 10);
                if (end == p || fd < 0 || fd > 1 << 20 || K.nkeep == 16 || (*end && *end != ','))
                    return usage();
                K.keep[K.nkeep++] = (int)fd;
                p = *end ? end + 1 : end;
            }
        } else if (strncmp(argv[k], "beacon=", 7) == 0) {
            if (beacon_map(argv[k] + 7) < 0)
                return usage();
        } else
            return usage();
    }
    /* nothing of the owner's but these two: a leaked pipe end would hold a
     * lifeline open for as long as the job lives */
    if (K.nkeep)
        close_all_but();
    else
        close_others(K.ctl, K.ownerfd);
    for (int k = 0; k < K.nkeep; k++) /* a child gets one only where a spawn maps it */
        fcntl(K.keep[k], F_SETFD, FD_CLOEXEC);
    /* the fds the owner handed over must not reach any child */
    fcntl(K.ctl, F_SETFD, FD_CLOEXEC);
    pass_creds(K.ctl); /* before "ready": the owner sends nothing until it */
    if (K.ownerfd >= 0)
        fcntl(K.ownerfd, F_SETFD, FD_CLOEXEC);
    { /* before a PID namespace would hide the owner's number */
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/%d", (int)K.owner);
        beacon_proc = openat(AT_FDCWD, proc, O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    prctl(PR_SET_NAME, "tether-keeper", 0, 0, 0);
    setpgid(0, 0); /* a caller killing the owner's group must not take us along */
    /* A known signal state: everything default (an owner's posix_spawn on
     * glibc < 2.38 leaves glibc's 32 and 33 ignored here), and what a keeper
     * must survive (the caller may kill the owner's group) blocked, never
     * to be taken: blocked rather than ignored, so a child starts with every
     * disposition at its default and calls sigaction only for what the
     * owner ignores (with eight ignored here, each child set all eight back
     * before its exec); child_main gives it the owner's mask. SIGCHLD is
     * blocked as well: it is read from a signalfd (below). */
    for (int s = 1; s < 65; s++)
        if (s != SIGKILL && s != SIGSTOP)
            raw_signal(s, SIG_DFL);
    static const int survived[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP, SIGTTIN, SIGTTOU,
                                   SIGPIPE};
    sigset_t blocked;
    sigemptyset(&blocked);
    for (size_t k = 0; k < sizeof survived / sizeof *survived; k++)
        sigaddset(&blocked, survived[k]);
    sigprocmask(SIG_BLOCK, &blocked, NULL);
    keeper_umask = (int)umask(0);
    umask((mode_t)keeper_umask);
    for (int r = 0; r < RLIM_NLIMITS; r++)
        if (getrlimit(r, &K.lim[r]) < 0)
            K.lim[r].rlim_cur = K.lim[r].rlim_max = 0; /* unknown: always set */
    if (chdir("/") < 0) { /* never pin a mount point; children chdir to the owner's cwd */
    }
    if (read_file("/proc/sys/kernel/random/boot_id", K.boot, sizeof K.boot) > 0) {
        char *nl = strchr(K.boot, '\n');
        if (nl)
            *nl = '\0';
    }
    switch (K.mech) {
    case M_CGROUP:
        if (!K.cgroup[0])
            refuse("cgroup: no cgroup= given");
        K.cgfd = openat(AT_FDCWD, K.cgroup, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (K.cgfd < 0)
            refuse("cgroup: cannot open %s: %s", K.cgroup, strerror(errno));
        if (!K.legacy) /* (the legacy path moves children by writing cgroup.procs) */
            hold_procs_files();
        /* A member's orphan comes to us, not to PID 1 (which may reap late,
         * or never, as an app that is a container's PID 1): still a member,
         * reaped at once. Only its parent changes, so a refusal is no matter. */
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        break;
    case M_SUBREAPER:
        if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
            refuse("prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
        break;
    case M_PIDNS:
        enter_pidns();
        break;
    }
    K.have_clone3 = !K.legacy;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    K.sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (K.sigfd < 0)
        refuse("signalfd: %s", strerror(errno));
    beacon_start(); /* (after the namespace's fork, which keeps one thread) */
    /* The owner may have died before the watch was set up. */
    if (K.ownerfd >= 0) {
        struct pollfd o = {K.ownerfd, POLLIN, 0};
        if (poll(&o, 1, 0) > 0)
            end_for_dead_owner();
    } else if (kill(K.owner, 0) < 0 && errno == ESRCH) {
        end_for_dead_owner();
    }
    ready(0);
    serve();
}
#endif
