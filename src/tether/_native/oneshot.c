/*
 * The one-command driver of tether-keeper: one command in a job of its own,
 * reported on a pipe. Included by keeper.c (the socket driver's program),
 * so both drivers share one ending engine: the spawn into the job
 * (spawn_followed), the kill loops and cgroup.kill (kill_all), the cgroup's
 * removal (cleanup).
 *
 * Who runs it:
 *  - the native tether-shell and tether (shell.c) fork it in-process
 *    (keeper_begin): no exec on the hot path;
 *  - the Python tether-shell (tether/keeper/oneshot.py), for the cases the
 *    native front end hands over, execs it:
 *
 *   tether-keeper one REP_FD CTL_FD OWNER_PIDFD OWNER_PID OWNER_START PGID
 *                 auto|cgroup|subreaper GRACE_MS [base=DIR mount=DIR]
 *                 [caller=FD:PID:START [scope=caller]] [ign=HEX] [mask=HEX]
 *                 -- EXE ARGV0 [ARG...]
 *
 *   base: the cgroup this job's run directory goes under (the Python front
 *   end decided it may: cgroupfs.base_dir); none: a subreaper job. ign/mask:
 *   the caller's ignored and blocked signals as bit masks (bit N-1: signal
 *   N), which the command gets. The environment is the command's, the job's
 *   cookie first.
 *
 * The reports, one line each on REP_FD: "P <pid> <mechanism> <start ticks>
 * <cgroup or ->" once the command runs; then "X <wait status> <leftovers>
 * [caller|linger]", or "E job|exec|spawn <errno> <words>" when nothing ran.
 * A byte on CTL_FD (the owner got SIGTERM/SIGHUP) ends the job now; its EOF,
 * or the owner's pidfd, means the owner is gone: everything ends, no grace,
 * no report. The caller's pidfd readable: its commands end at once
 * ("caller").
 *
 * scope=caller (tether-shell's TETHER_SHELL_SCOPE=caller): what the command
 * leaves is not ended when it returns; it is the caller's until the caller
 * ends. A cgroup job is then <job id> below the caller's one cgroup,
 * <base>/tether-<caller pid>-<caller start>/shell-scope: the command's own
 * cgroup ends when it is stopped or its owner dies, and a watcher of the
 * caller's (scope_keeper, "tether-scope") ends the caller's whole cgroup
 * when the caller dies. A subreaper job stays: once the command returns, its keeper reports
 * "linger" (the owner does not wait for it) and keeps what the command left
 * until that is gone or the caller dies.
 */

#include <limits.h>
#include <stdarg.h>
#include <sys/file.h>

/* Start ticks of pid (field 22 of /proc/PID/stat), 0 when unreadable; the
 * state letter into *state when asked, the parent into *ppid. */
static unsigned long long proc_stat(pid_t pid, char *state, pid_t *ppid)
{
    char path[64], buf[1024];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    if (read_file(path, buf, sizeof buf) <= 0)
        return 0;
    const char *st = stat_field(buf, 3), *pp = stat_field(buf, 4), *start = stat_field(buf, 22);
    if (!st || !pp || !start)
        return 0;
    if (state)
        *state = *st;
    if (ppid)
        *ppid = (pid_t)strtol(pp, NULL, 10);
    return strtoull(start, NULL, 10);
}

/* identity.now_ticks: CLOCK_BOOTTIME in clock ticks, rounded down as the
 * kernel rounds a task's start time. */
static unsigned long long now_ticks(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    unsigned long long hz = (unsigned long long)sysconf(_SC_CLK_TCK);
    unsigned long long ns = (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
    return ns / (1000000000ULL / hz);
}

struct run {
    char shell[PATH_MAX];
    char **argv;
    char **path; /* PATH's entries, for a command without a '/' */
    int only_stdio; /* the command gets fds 0-2 only (tether run: Popen's close_fds) */
    int cli;        /* tether run: a refused spawn is refused (Job's rule), no fallback */
    double grace;
    int mech_auto, want_cgroup;
    char base[4096], mount[4096]; /* where the cgroup goes (cgroup mechanism) */
    pid_t owner, pgid;
    unsigned long long owner_start;
    int ownerfd;
    int callerfd; /* -1: the caller is not watched */
    int scope_caller; /* scope=caller: what the command leaves is the caller's */
    int lifefd;   /* tether run --lifeline FD, else -1: the job ends at its EOF/hangup */
    pid_t caller;
    unsigned long long caller_start;
    unsigned char orig_ign[65];
    sigset_t orig_mask;
    char cookie[200];
    char run_id[64], job_id[64];
    unsigned long long born;
};


static int rep_w = -1, ctl_r = -1;

static void tell(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tell(const char *fmt, ...)
{
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(rep_w, line, (size_t)n);
    (void)w;
}

/* poll with no timeout, again after a signal's EINTR (every wake-up these
 * loops want comes through an fd: SIGCHLD too, by signalfd) */
static int poll_fds(struct pollfd *p, nfds_t n)
{
    int r;
    while ((r = poll(p, n, -1)) < 0 && errno == EINTR) {
    }
    return r;
}

static int readable(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return fd >= 0 && poll(&p, 1, 0) > 0;
}

/* The lifeline (a pipe or socket the app holds the other end of): gone at
 * hangup, error or EOF. What the app writes into it means nothing and is
 * read away, never more than is there (FIONREAD), so no read can block. */
static int lifeline_gone(int fd, short revents)
{
    if (revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP))
        return 1;
    if (!(revents & POLLIN))
        return 0;
    int n = 0;
    if (ioctl(fd, FIONREAD, &n) < 0 || n <= 0)
        return 1; /* readable with nothing to read: EOF */
    char sink[4096];
    ssize_t r = read(fd, sink, (size_t)n < sizeof sink ? (size_t)n : sizeof sink);
    return r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN);
}

static int lifeline_gone_now(int fd)
{
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    return fd >= 0 && poll(&p, 1, 0) > 0 && lifeline_gone(fd, p.revents);
}

/* The members of the job, this keeper aside: the cgroup's (and its child
 * cgroups'), or the subreaper's descendants; only those born after the job
 * began and not yet dead. */
static size_t nmembers;
static pid_t members_buf[MAX_CHILDREN];

/* Every descendant of root, breadth first, by the kernel's children lists. */
static size_t descendants(pid_t root, pid_t *out, size_t cap)
{
    size_t n = children_of(root, out, cap, 1);
    for (size_t k = 0; k < n; k++)
        n += children_of(out[k], out + n, cap - n, 1);
    return n;
}
static unsigned long long members_start[MAX_CHILDREN]; /* their start ticks, as read */
static pid_t members_ppid[MAX_CHILDREN];
static unsigned long long members_born;

static void add_members_of(const char *dir, int depth)
{
    char path[4200];
    static char buf[65536];
    const char *base = strrchr(dir, '/');
    if (depth > 0 && base && strcmp(base + 1, PIN_DIR) == 0)
        return; /* a job's pin (keeper.c's pin_job), not a member */
    if ((size_t)snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= sizeof path)
        return;
    ssize_t len = read_file(path, buf, sizeof buf);
    for (char *p = buf; len > 0 && *p && nmembers < MAX_CHILDREN;) {
        char *e;
        long c = strtol(p, &e, 10);
        if (e == p)
            break;
        p = e;
        if (c > 1 && c != getpid())
            members_buf[nmembers++] = (pid_t)c;
    }
    if (depth <= 16)
        each_subdir(dir, depth, add_members_of);
}

/* The live members now, each with the start ticks and parent read for it. */
static size_t members(void)
{
    nmembers = 0;
    if (K.mech == M_CGROUP)
        add_members_of(K.cgroup, 0);
    else
        nmembers = descendants(getpid(), members_buf, MAX_CHILDREN);
    size_t live = 0;
    for (size_t k = 0; k < nmembers; k++) {
        char st = 0;
        pid_t ppid = 0;
        unsigned long long start = proc_stat(members_buf[k], &st, &ppid);
        if (start && start >= members_born && st != 'Z' && st != 'X' && st != 'x') {
            members_buf[live] = members_buf[k];
            members_start[live] = start;
            members_ppid[live++] = ppid;
        }
    }
    return nmembers = live;
}

/* Signal pid through a pidfd if, once pinned, it is still the process that
 * started at start (the pid of one that exited a moment ago may name someone
 * else now) - and, in a cgroup job, still a member (member_only). */
static int signal_if_still(pid_t pid, unsigned long long start, int sig, int member_only)
{
    int fd = pidfd_open_(pid);
    if (fd < 0)
        return 0;
    int ok = proc_stat(pid, NULL, NULL) == start && (!member_only || cg_is_member(pid)) &&
             pidfd_signal_(fd, sig) == 0;
    close(fd);
    return ok;
}

static int signal_member(size_t k, int sig)
{
    return signal_if_still(members_buf[k], members_start[k], sig, K.mech == M_CGROUP);
}

struct pid_at {
    pid_t pid;
    size_t at; /* its index in members_buf */
};

static int by_pid(const void *a, const void *b)
{
    pid_t x = ((const struct pid_at *)a)->pid, y = ((const struct pid_at *)b)->pid;
    return (x > y) - (x < y);
}

/* tether.ending.depth_order: member indices by depth along the ppid links
 * among the members, parents first (the members sorted by pid answer "is
 * this one's parent a member, and which" in log n). */
static size_t *parents_first(size_t n)
{
    static struct pid_at sorted[MAX_CHILDREN];
    static size_t order[MAX_CHILDREN];
    static int depth[MAX_CHILDREN];
    for (size_t k = 0; k < n; k++)
        sorted[k] = (struct pid_at){members_buf[k], k};
    qsort(sorted, n, sizeof *sorted, by_pid);
    int deepest = 0;
    for (size_t k = 0; k < n; k++) {
        int d = 0;
        struct pid_at key = {members_ppid[k], 0};
        const struct pid_at *up;
        while (d < 64 && (up = bsearch(&key, sorted, n, sizeof *sorted, by_pid))) {
            d++;
            key.pid = members_ppid[up->at];
        }
        depth[k] = d;
        if (d > deepest)
            deepest = d;
    }
    size_t m = 0;
    for (int d = 0; d <= deepest; d++)
        for (size_t k = 0; k < n; k++)
            if (depth[k] == d)
                order[m++] = k;
    return order;
}

/* tether.ending.end for the job: SIGTERM to every member, parents first (a
 * wrapper hears it before it sees a child die), then SIGCONT; up to grace
 * seconds for them to go (not once the owner is gone: then nobody waits for
 * a report); then the mechanism's kill. */
static void end_job(double grace)
{
    size_t n = members();
    if (!n)
        return;
    if (grace > 0) {
        size_t *order = parents_first(n);
        int told = 0;
        for (size_t k = 0; k < n; k++)
            if (signal_member(order[k], SIGTERM))
                told = 1;
        for (size_t k = 0; k < n; k++)
            signal_member(order[k], SIGCONT);
        if (told) {
            double deadline = now_s() + grace;
            long delay = 1000;
            for (;;) {
                reap_all(0);
                if (!members() || now_s() >= deadline || readable(K.ownerfd))
                    break;
                double left = deadline - now_s();
                long us = delay < (long)(left * 1e6) ? delay : (long)(left * 1e6);
                if (us > 0)
                    nap_us(us);
                delay = delay * 2 < 50000 ? delay * 2 : 50000;
            }
        }
        if (!members())
            return;
    }
    kill_all(KILL_BOUND);
}

/* Start the shell in the job, as op_spawn does (the born-killed retry
 * included); its pid, or -1 with what failed in *stage ('e' exec and the
 * like, 'g' placing it in the job, 'c' clone) and *err. */
static pid_t spawn_command(struct run *R, char **envp, char *stage, int *err)
{
    struct spawn_req q;
    memset(&q, 0, sizeof q);
    q.argv = R->argv;
    q.envp = envp;
    q.exe = R->shell;
    q.path = R->path;
    q.cwd = NULL;
    q.cwd_fd = -1;
    q.pgroup = R->pgid;
    q.mask = R->orig_mask;
    q.umask_ = -1;
    for (int s = 1; s < 65; s++)
        q.ign[s] = R->orig_ign[s];
    /* default in the command whatever came in: an interpreter in front (the
     * Python tether-shell, which execs this driver) ignores both itself, so
     * whether its caller did is not known; subprocess gives them back too */
    q.ign[SIGPIPE] = q.ign[SIGXFSZ] = 0;
    q.only_stdio = R->only_stdio;
    int pidfd;
    unsigned char b[6];
    ssize_t n = 0;
    pid_t pid = spawn_followed(&q, &pidfd, b, &n);
    if (pid < 0) {
        *stage = 'c';
        *err = errno;
        return -1;
    }
    if (pidfd >= 0)
        close(pidfd);
    if (n == (ssize_t)sizeof b || n == 0) { /* failed before exec, or killed at birth */
        int st;
        while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR) {
        }
        *stage = n == 0 ? 'g' : (char)b[1];
        *err = n == 0 ? EBUSY : (int)b[2] | ((int)b[3] << 8) | ((int)b[4] << 16) | ((int)b[5] << 24);
        return -1;
    }
    if (K.nkids < MAX_CHILDREN)
        K.kids[K.nkids++] = pid;
    return pid;
}

/* scope=caller: the caller's cgroup, the parent of its commands' (K.cgroup). */
static char scope_dir[4096];

/* Give back a cgroup in which nothing of ours ran: removed, with its run
 * directory when that is empty. In scope=caller, the caller's cgroup too
 * when nothing is in it and no watcher holds it (else the caller's next
 * command would make it again and start a second watcher). */
static void release_cgroup(void)
{
    cleanup();
    K.cgroup[0] = '\0';
    if (!scope_dir[0])
        return;
    int lock = openat(AT_FDCWD, scope_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) == 0 && rmdir(scope_dir) == 0)
        rmdir_run_dir_of(scope_dir);
    if (lock >= 0)
        close(lock);
    scope_dir[0] = '\0';
}

/* mkdir, 1 when made, 0 when it was there, -1 otherwise (errno). */
static int make_dir(const char *path)
{
    if (mkdir(path, 0777) == 0)
        return 1;
    return errno == EEXIST ? 0 : -1;
}

/* The job's cgroup: <base>/tether-<owner pid>-<owner start>/<job id>; for
 * scope=caller <base>/tether-<caller pid>-<caller start>/shell-scope/<job
 * id>, below the caller's cgroup (made by whichever of its commands comes
 * first), so that each command's processes are its cgroup's. */
static int open_cgroup(struct run *R, char *why, size_t whysize, int *err)
{
    char dir[4096];
    int shared = R->scope_caller, made_run = -1, made_scope = 0;
    errno = ENAMETOOLONG;
    if ((size_t)snprintf(dir, sizeof dir, "%s/tether-%d-%llu", R->base,
                         (int)(shared ? R->caller : R->owner),
                         shared ? R->caller_start : R->owner_start) < sizeof dir)
        made_run = make_dir(dir);
    if (made_run >= 0 && shared) {
        errno = ENAMETOOLONG;
        made_scope = (size_t)snprintf(scope_dir, sizeof scope_dir, "%s/%s", dir,
                                      TETHER_SHELL_SCOPE_DIR) < sizeof scope_dir
                         ? make_dir(scope_dir)
                         : -1;
    }
    if (made_run < 0 || made_scope < 0)
        scope_dir[0] = '\0'; /* (errno: why) */
    else if ((size_t)snprintf(K.cgroup, sizeof K.cgroup, "%s/%s", shared ? scope_dir : dir,
                              R->job_id) >= sizeof K.cgroup)
        errno = ENAMETOOLONG;
    else if (mkdir(K.cgroup, 0777) == 0)
        errno = 0;
    if (errno) {
        *err = errno;
        snprintf(why, whysize, "%s", strerror(errno));
        if (made_scope > 0)
            rmdir(scope_dir);
        if (made_run > 0)
            rmdir(dir);
        K.cgroup[0] = scope_dir[0] = '\0';
        return -1;
    }
    snprintf(K.mount, sizeof K.mount, "%s", R->mount);
    K.cgfd = openat(AT_FDCWD, K.cgroup, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (K.cgfd < 0) {
        *err = errno;
        snprintf(why, whysize, "%s", strerror(errno));
        release_cgroup();
        return -1;
    }
    K.mech = M_CGROUP;
    return 0;
}

static int open_subreaper(char *why, size_t whysize, int *err)
{
    K.mech = M_SUBREAPER;
    K.cgroup[0] = '\0';
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        *err = errno;
        snprintf(why, whysize, "prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Wait for our child pid (SIGKILLed a moment ago) up to KILL_BOUND: 1 with its
 * status, 0 if it is not gone by then (a process in D state). */
static int wait_killed(pid_t pid, int *st)
{
    double deadline = now_s() + KILL_BOUND;
    for (;;) {
        pid_t got = waitpid(pid, st, WNOHANG | __WALL);
        if (got == pid)
            return 1;
        if ((got < 0 && errno != EINTR) || now_s() > deadline)
            return 0;
        nap_us(1000);
    }
}

/* Keep only these fds (and a /dev/null stdio) and leave the caller's cwd:
 * nothing of the caller's may stay open in the keeper once the command has
 * it (a pipe's reader would wait for the keeper too). */
static void let_go(const int *keep, int n)
{
    close_all_except(keep, n);
    int null = openat(AT_FDCWD, "/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        for (int fd = 0; fd < 3; fd++)
            dup2(null, fd);
        if (null > 2)
            close(null);
    }
    if (chdir("/") < 0) { /* never pin the caller's mount */
    }
}

/* The watcher of a caller's cgroup (scope=caller, scope_dir): one per
 * caller, outside the cgroup, named tether-scope, in a session of its own,
 * holding only the caller's pidfd and an exclusive flock on the cgroup's
 * directory for its whole life - so "is the caller watched" is one lock try
 * that the kernel answers, and the lock goes with its holder however it
 * dies (the caller's next command then starts another). When the caller
 * dies, it ends everything in the cgroup (its commands' cgroups below it)
 * and removes it. */
static void scope_keeper(int callerfd, int lock) __attribute__((noreturn));
static void scope_keeper(int callerfd, int lock)
{
    setsid();
    prctl(PR_SET_NAME, "tether-scope", 0, 0, 0);
    int keep[] = {callerfd, lock};
    let_go(keep, 2);
    struct pollfd p = {callerfd, POLLIN, 0};
    poll_fds(&p, 1);
    snprintf(K.cgroup, sizeof K.cgroup, "%s", scope_dir);
    kill_cgroup(KILL_BOUND);
    cleanup();
    _exit(0);
}

static void ensure_scope_keeper(int callerfd)
{
    int lock = openat(AT_FDCWD, scope_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock < 0)
        return;
    if (flock(lock, LOCK_EX | LOCK_NB) < 0) { /* held: the caller is watched already */
        close(lock);
        return;
    }
    if (fork() == 0)
        scope_keeper(callerfd, lock);
    /* the watcher's copy holds the lock now (none forked: the commands' own
     * keepers still watch the caller while they run) */
    close(lock);
}

/* Open the job as asked: a cgroup under base (for auto, a subreaper where
 * none can be made), else a subreaper; SIGCHLD comes through a signalfd.
 * On failure: the "E" report, and this keeper is gone. */
static void open_job(struct run *R, const char *asked)
{
    char why[600] = "";
    int err = 0;
    int ok;
    if (R->want_cgroup) {
        ok = open_cgroup(R, why, sizeof why, &err) == 0;
        if (!ok && R->mech_auto)
            ok = open_subreaper(why, sizeof why, &err) == 0;
    } else {
        ok = open_subreaper(why, sizeof why, &err) == 0;
    }
    if (!ok) {
        tell("E job %d cannot create the job (%s): %s", err, asked, why);
        _exit(0);
    }
    K.have_clone3 = 1;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    K.sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (K.sigfd < 0) {
        err = errno;
        release_cgroup();
        tell("E job %d cannot create the job (%s): signalfd: %s", err, asked, strerror(err));
        _exit(0);
    }
}

/* Start the command in the job (for auto, in a subreaper job where the
 * cgroup will not take it): its pid. On failure: the report, and gone. */
static pid_t start_command(struct run *R, char **envp)
{
    char stage = 0, why[600] = "";
    int err = 0;
    pid_t child = spawn_command(R, envp, &stage, &err);
    if (child < 0 && K.mech == M_CGROUP && (stage == 'c' || stage == 'g') &&
        (err == EACCES || err == EPERM || err == EBUSY || err == EOPNOTSUPP || err == ENOENT)) {
        /* not allowed into the job's cgroup (a delegated subtree needs write
         * access to the common ancestor's cgroup.procs) */
        release_cgroup();
        if (R->cli) {
            tell("E spawn %d spawn refused by the job's keeper: cannot place the child in the job: %s",
                 err, strerror(err));
            _exit(0);
        }
        if (!R->mech_auto) {
            tell("E job 13 cannot create the job (cgroup): cannot join the job's cgroup");
            _exit(0);
        }
        if (open_subreaper(why, sizeof why, &err) < 0) {
            tell("E job %d cannot create the job (auto): %s", err, why);
            _exit(0);
        }
        child = spawn_command(R, envp, &stage, &err);
    }
    if (child < 0) {
        release_cgroup();
        if (stage == 'c' || stage == 'g')
            tell("E job %d cannot place the child in the job: %s", err, strerror(err));
        else
            tell("E exec %d", err);
        _exit(0);
    }
    return child;
}

/* How the wait for the command ended; its status when it exited (have). */
struct waited {
    int owner_gone, stop, caller_gone, have, st;
};

/* Wait until the command exits, the owner goes, a stop comes, or the caller
 * (or the app, at the lifeline's end) goes. */
static void watch_command(const struct run *R, pid_t child, struct waited *e)
{
    /* a watch not asked for is fd -1, which poll skips */
    struct pollfd p[5] = {{K.ownerfd, POLLIN, 0}, {ctl_r, POLLIN, 0}, {K.sigfd, POLLIN, 0},
                          {R->callerfd, POLLIN, 0}, {R->lifefd, POLLIN | POLLRDHUP, 0}};
    reap_all(0);
    while (!(e->have = take_status(child, &e->st)) && !e->owner_gone && !e->stop &&
           !e->caller_gone) {
        if (poll_fds(p, 5) < 0) {
            e->owner_gone = 1;
            break;
        }
        if (p[2].revents & POLLIN) {
            drain_sigfd();
            reap_all(0);
        }
        if (R->callerfd >= 0 && (p[3].revents & (POLLIN | POLLHUP | POLLERR)))
            e->caller_gone = 1;
        if (R->lifefd >= 0 && lifeline_gone(R->lifefd, p[4].revents))
            e->caller_gone = 1; /* the app's end of its lifeline closed: it died */
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR))
            e->owner_gone = 1;
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            char c;
            ssize_t n = read(ctl_r, &c, 1);
            if (n > 0)
                e->stop = 1;
            else if (n == 0 || errno != EINTR)
                e->owner_gone = 1; /* the owner's end closed: it died */
        }
    }
}

/* scope=caller, subreaper: the command returned and left processes, which
 * are this keeper's (it is their subreaper) until the caller ends. The
 * owner no longer waits ("linger"); stay, watching only the caller, until
 * the last of them is reaped or the caller dies (then they all end). */
static void linger(const struct run *R) __attribute__((noreturn));
static void linger(const struct run *R)
{
    close(rep_w);
    close(ctl_r);
    close(K.ownerfd);
    rep_w = ctl_r = K.ownerfd = -1;
    struct pollfd p[2] = {{R->callerfd, POLLIN, 0}, {K.sigfd, POLLIN, 0}};
    while (reap_all(0)) {
        if (poll_fds(p, 2) < 0)
            break;
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            kill_all(KILL_BOUND);
            break;
        }
        if (p[1].revents & POLLIN)
            drain_sigfd();
    }
    _exit(0);
}

/* The command's status is reported once what it left is dealt with: ended
 * (scope=caller: only when it was stopped), or kept for the caller. */
static void finish(const struct run *R, pid_t child, struct waited *e) __attribute__((noreturn));
static void finish(const struct run *R, pid_t child, struct waited *e)
{
    if (e->caller_gone) {
        /* The caller (an agent CLI) is gone: its commands go with it, at
         * once (scope=caller: all it kept, the caller's whole cgroup). */
        if (scope_dir[0])
            snprintf(K.cgroup, sizeof K.cgroup, "%s", scope_dir);
        kill_all(KILL_BOUND);
        reap_all(0);
        if (!e->have)
            e->have = take_status(child, &e->st);
        /* killed: out of the cgroup before it is a zombie to wait for */
        if (!e->have && !wait_killed(child, &e->st))
            e->st = -1;
        tell("X %d 0 caller", e->st);
        cleanup();
        _exit(0);
    }
    if (e->owner_gone) {
        kill_all(KILL_BOUND); /* nobody to report to: everything ends now, no grace */
        cleanup();
        _exit(0);
    }
    size_t left = members();
    size_t leftovers = 0;
    for (size_t k = 0; k < left; k++)
        if (members_buf[k] != child)
            leftovers++;
    if (left && (e->stop || !R->scope_caller))
        end_job(R->grace);
    reap_all(0);
    if (!e->have)
        e->have = take_status(child, &e->st);
    if (!e->have)
        e->have = wait_killed(child, &e->st); /* dead, or dying: it was killed above */
    int kept = R->scope_caller && !e->stop && leftovers; /* the caller's now */
    int stays = kept && K.mech == M_SUBREAPER;
    tell("X %d %zu%s", e->have ? e->st : -1, leftovers, stays ? " linger" : "");
    if (stays)
        linger(R);
    if (!kept) /* (a cgroup that holds what the caller keeps: its watcher's to remove) */
        cleanup();
    _exit(0);
}

static void keeper_run(struct run *R, char **envp) __attribute__((noreturn));
static void keeper_run(struct run *R, char **envp)
{
    open_job(R, R->mech_auto ? "auto" : R->want_cgroup ? "cgroup" : "subreaper");
    if (readable(ctl_r) || readable(R->callerfd) || lifeline_gone_now(R->lifefd)) {
        release_cgroup(); /* stopped (or the owner or its caller died) while we set up */
        tell("X -1 0");
        _exit(0);
    }
    members_born = now_ticks(); /* nothing of the command is older */
    pid_t child = start_command(R, envp);
    if (R->scope_caller && K.mech == M_CGROUP)
        ensure_scope_keeper(R->callerfd);
    tell("P %d %s %llu %s", (int)child, K.mech == M_CGROUP ? "cgroup" : "subreaper",
         proc_stat(child, NULL, NULL), K.mech == M_CGROUP ? K.cgroup : "-");
    int keep[] = {K.ownerfd, ctl_r, rep_w, K.sigfd, R->callerfd, K.cgfd, R->lifefd};
    let_go(keep, (int)(sizeof keep / sizeof *keep));
    struct waited e = {0, 0, 0, 0, 0};
    watch_command(R, child, &e);
    finish(R, child, &e);
}

/* Whether pid's environment holds entry ("\0VAR=VALUE\0", elen bytes). */
static int carries(pid_t pid, const char *entry, int elen)
{
    static char env[1 << 20];
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    env[0] = '\0';
    ssize_t len = read_file(path, env + 1, sizeof env - 2);
    return len > 0 && memmem(env, (size_t)len + 2, entry, (size_t)elen) != NULL;
}

/* A job whose keeper vanished, ended from its owner (the front end): the
 * cgroup's kill (cgroup: "" for none), and every process that carries the
 * job's cookie (what a subreaper job's members were re-parented away with),
 * born after the job began, with what it started (environ.carriers). */
__attribute__((unused)) /* (the front ends' only: shell.c) */
static void end_without_keeper(const char *cgroup, const char *mount, const char *cookie,
                               unsigned long long born)
{
    if (cgroup[0]) {
        snprintf(K.cgroup, sizeof K.cgroup, "%s", cgroup);
        snprintf(K.mount, sizeof K.mount, "%s", mount);
        K.mech = M_CGROUP;
        kill_cgroup(KILL_BOUND);
    }
    char entry[240];
    int elen = snprintf(entry, sizeof entry, "%c%s=%s%c", 0, TETHER_COOKIE_VAR, cookie, 0);
    uid_t me = geteuid();
    double deadline = now_s() + KILL_BOUND;
    while (now_s() < deadline) {
        int found = 0;
        struct dir_walk w;
        if (dir_open(&w, "/proc") < 0)
            return;
        for (const struct dent64 *d; (d = dir_next(&w));) {
            char *e;
            long pid = strtol(d->name, &e, 10);
            if (*e || pid <= 2 || pid == getpid())
                continue;
            char st = 0;
            unsigned long long start = proc_stat((pid_t)pid, &st, NULL);
            if (!start || start < born || st == 'Z' || st == 'X' || st == 'x')
                continue;
            char path[64];
            snprintf(path, sizeof path, "/proc/%ld", pid);
            struct stat sb;
            if (stat(path, &sb) < 0 || (me != 0 && sb.st_uid != me))
                continue;
            if (!carries((pid_t)pid, entry, elen))
                continue;
            /* what it started too (environ.carriers: a child may have
             * cleared its environment), read before it dies */
            size_t nd = descendants((pid_t)pid, scratch, MAX_CHILDREN);
            if (signal_if_still((pid_t)pid, start, SIGKILL, 0))
                found = 1;
            for (size_t k = 0; k < nd; k++) {
                unsigned long long ds = proc_stat(scratch[k], NULL, NULL);
                if (ds && ds >= born && signal_if_still(scratch[k], ds, SIGKILL, 0))
                    found = 1;
            }
        }
        close(w.fd);
        if (!found)
            return;
        nap_us(2000);
    }
}

/* The forked (or exec'd) keeper's set-up, then the job: never returns. The
 * caller of the owner may kill the owner's group: the keeper goes into a
 * group of its own and ignores what such a caller sends. */
static void keeper_begin(struct run *R, char **envp, int rep, int ctl) __attribute__((noreturn));
static void keeper_begin(struct run *R, char **envp, int rep, int ctl)
{
    rep_w = rep;
    ctl_r = ctl;
    setpgid(0, 0);
    prctl(PR_SET_NAME, "tether-keeper", 0, 0, 0);
    static const int ignored[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP, SIGTTIN,
                                  SIGTTOU, SIGPIPE};
    for (int s = 1; s < 65; s++)
        K.ign[s] = R->orig_ign[s];
    for (size_t k = 0; k < sizeof ignored / sizeof *ignored; k++) {
        raw_signal(ignored[k], SIG_IGN);
        K.ign[ignored[k]] = 1;
    }
    raw_signal(SIGCHLD, SIG_DFL); /* we wait for our children, whatever the caller ignores */
    K.ign[SIGCHLD] = 0;
    K.ctl = -1;
    K.owner = R->owner;
    K.ownerfd = R->ownerfd;
    K.cgfd = -1;
    keeper_run(R, envp);
}

/* -- `tether-keeper one`: the same driver, exec'd ---------------------------------- */

/* A decimal number up to `stop`; *s moves past it. (No scanf and no
 * strtod in this program: their code would be every keeper's memory.) */
static int one_number(const char **s, char stop, unsigned long long *out)
{
    char *end;
    if (**s < '0' || **s > '9')
        return -1;
    errno = 0;
    *out = strtoull(*s, &end, 10);
    if (errno || *end != stop)
        return -1;
    *s = end + (stop != '\0');
    return 0;
}

/* A file descriptor given in decimal: open, and made close-on-exec (the
 * command gets none of the keeper's). */
static int one_fd_of(unsigned long long v, int *out)
{
    if (v > INT_MAX)
        return -1;
    *out = (int)v;
    return fcntl(*out, F_SETFD, FD_CLOEXEC); /* (fails for an fd that is not open) */
}

static int one_fd(const char *s, int *out)
{
    unsigned long long v;
    return one_number(&s, '\0', &v) < 0 ? -1 : one_fd_of(v, out);
}

static int one_mask(const char *s, unsigned long long *bits)
{
    char *end;
    errno = 0;
    *bits = strtoull(s, &end, 16);
    return *end || end == s || errno ? -1 : 0;
}

/* caller=FD:PID:START */
static int one_caller(const char *s, struct run *R)
{
    unsigned long long fd, pid, start;
    if (one_number(&s, ':', &fd) < 0 || one_number(&s, ':', &pid) < 0 ||
        one_number(&s, '\0', &start) < 0 || !pid || pid > INT_MAX ||
        one_fd_of(fd, &R->callerfd) < 0)
        return -1;
    R->caller = (pid_t)pid;
    R->caller_start = start;
    return 0;
}

static int one_option(const char *a, struct run *R)
{
    unsigned long long bits;
    if (!strncmp(a, "base=", 5))
        return (size_t)snprintf(R->base, sizeof R->base, "%s", a + 5) >= sizeof R->base ? -1 : 0;
    if (!strncmp(a, "mount=", 6))
        return (size_t)snprintf(R->mount, sizeof R->mount, "%s", a + 6) >= sizeof R->mount ? -1 : 0;
    if (!strncmp(a, "caller=", 7))
        return one_caller(a + 7, R);
    if (!strcmp(a, "scope=caller") || !strcmp(a, "scope=command")) {
        R->scope_caller = !strcmp(a, "scope=caller");
        return 0;
    }
    if (!strncmp(a, "ign=", 4) && one_mask(a + 4, &bits) == 0) {
        for (int s = 1; s < 65; s++)
            R->orig_ign[s] = (unsigned char)((bits >> (s - 1)) & 1);
        return 0;
    }
    if (!strncmp(a, "mask=", 5) && one_mask(a + 5, &bits) == 0) {
        sigemptyset(&R->orig_mask);
        for (int s = 1; s < 65; s++)
            if ((bits >> (s - 1)) & 1)
                sigaddset(&R->orig_mask, s);
        return 0;
    }
    return -1;
}

static int usage(void); /* keeper.c's: every form, this one's included */

static int one_main(int argc, char **argv)
{
    static struct run R;
    static char *nopath[1];
    int rep, ctl;
    char *end;
    if (argc < 13 || one_fd(argv[2], &rep) < 0 || one_fd(argv[3], &ctl) < 0 ||
        one_fd(argv[4], &R.ownerfd) < 0)
        return usage();
    unsigned long long owner = strtoull(argv[5], &end, 10);
    if (*end || !owner || owner > INT_MAX)
        return usage();
    R.owner_start = strtoull(argv[6], &end, 10);
    if (*end)
        return usage();
    long pgid = strtol(argv[7], &end, 10);
    if (*end || pgid <= 0)
        return usage();
    R.owner = (pid_t)owner;
    R.pgid = (pid_t)pgid;
    R.mech_auto = !strcmp(argv[8], "auto");
    if (!R.mech_auto && strcmp(argv[8], "cgroup") && strcmp(argv[8], "subreaper"))
        return usage();
    unsigned long long grace_ms;
    const char *g = argv[9];
    if (one_number(&g, '\0', &grace_ms) < 0 || grace_ms > (unsigned long long)TETHER_MAX_GRACE * 1000)
        return usage();
    R.grace = (double)grace_ms / 1000;
    R.callerfd = R.lifefd = -1;
    sigemptyset(&R.orig_mask);
    int k = 10;
    for (; k < argc && strcmp(argv[k], "--"); k++)
        if (one_option(argv[k], &R) < 0)
            return usage();
    if (k + 2 >= argc || argv[k + 1][0] != '/' ||
        (size_t)snprintf(R.shell, sizeof R.shell, "%s", argv[k + 1]) >= sizeof R.shell)
        return usage();
    R.want_cgroup = R.base[0] != '\0';
    if (!R.want_cgroup && !strcmp(argv[8], "cgroup"))
        return usage(); /* the front end refuses that itself, with its reason */
    if (R.scope_caller && R.callerfd < 0)
        return usage(); /* scope=caller is the watched caller's */
    R.argv = argv + k + 2;
    R.path = nopath;
    if (R.scope_caller) /* (tether.keeper.oneshot names it alike) */
        snprintf(R.job_id, sizeof R.job_id, "s%d-%llu", (int)R.owner, R.owner_start);
    else
        snprintf(R.job_id, sizeof R.job_id, "j%d-1", (int)R.owner);
    /* What this process ignores is what the command is to ignore: exec kept
     * the interpreter's own ignores (SIGPIPE, SIGXFSZ), which ign= does not
     * list. (32 and 33 are glibc's, default after exec unless listed.) */
    for (int s = 1; s < 65; s++)
        if (s != SIGKILL && s != SIGSTOP && (R.orig_ign[s] || (s != 32 && s != 33)))
            raw_signal(s, R.orig_ign[s] ? SIG_IGN : SIG_DFL);
    extern char **environ;
    keeper_begin(&R, environ, rep, ctl);
}
