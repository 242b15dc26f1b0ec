/* The kernel's share of a spawn into a cgroup, without tether: clone3 of
 * /bin/true and a wait for it, in five places, in rounds whose order
 * rotates, GAP_US apart. Built and run by bench/cgroup_spawn.py, which
 * explains the places.
 *
 *   _cgroup_spawn BASE ROUNDS GAP_US   (BASE: a cgroup2 directory it may create)
 *
 * Prints one line per place: name, then the median, 10th and 90th
 * percentile in microseconds, and the median time clone3 took. Ends every
 * child it started (its own direct children, by pid, never reaped before
 * the kill) and removes every directory it made. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

enum { PLAIN, EMPTY, INSIDE, BELOW, BELOW_HELD, NPLACES };
static const char *const names[NPLACES] = {
    "outside any cgroup", "empty cgroup", "a process inside", "a process below",
    "a process below, procs held"};

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static char *const true_argv[] = {"/bin/true", NULL};

/* A copying clone3 (the keeper's shares its memory until the exec, which
 * needs a stack switch in assembly: see keeper.c); the same for every place. */
static pid_t spawn(int cgfd, double *clone_us)
{
    struct clone_args ca;
    memset(&ca, 0, sizeof ca);
    ca.exit_signal = SIGCHLD;
    if (cgfd >= 0) {
        ca.flags = CLONE_INTO_CGROUP;
        ca.cgroup = (uint64_t)cgfd;
    }
    double t = now_us();
    long pid = syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0) {
        execv(true_argv[0], true_argv);
        _exit(127);
    }
    *clone_us = now_us() - t;
    return (pid_t)pid;
}

/* A child that sleeps in cgroup fd until we kill it. */
static pid_t sleeper(int cgfd)
{
    struct clone_args ca;
    memset(&ca, 0, sizeof ca);
    ca.exit_signal = SIGCHLD;
    ca.flags = CLONE_INTO_CGROUP;
    ca.cgroup = (uint64_t)cgfd;
    long pid = syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0) {
        for (;;)
            pause();
    }
    return (pid_t)pid;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char dirs[8][4200];
static int ndirs;

static int make_dir(const char *base, const char *name)
{
    snprintf(dirs[ndirs], sizeof dirs[ndirs], "%s/%s", base, name);
    if (mkdir(dirs[ndirs], 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", dirs[ndirs], strerror(errno));
        return -1;
    }
    int fd = open(dirs[ndirs], O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        fprintf(stderr, "open %s: %s\n", dirs[ndirs], strerror(errno));
    ndirs++;
    return fd;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: _cgroup_spawn BASE ROUNDS GAP_US\n");
        return 2;
    }
    const char *base = argv[1];
    int rounds = atoi(argv[2]);
    long gap = atol(argv[3]);
    if (rounds < 1 || gap < 0)
        return 2;
    int fd[NPLACES];
    fd[PLAIN] = -1;
    fd[EMPTY] = make_dir(base, "empty");
    fd[INSIDE] = make_dir(base, "inside");
    fd[BELOW] = make_dir(base, "below");
    int below_pin = make_dir(dirs[ndirs - 1], "pin");
    fd[BELOW_HELD] = make_dir(base, "held");
    int held_pin = make_dir(dirs[ndirs - 1], "pin");
    pid_t kids[3] = {-1, -1, -1};
    int status = 1;
    if (fd[EMPTY] < 0 || fd[INSIDE] < 0 || fd[BELOW] < 0 || below_pin < 0 || fd[BELOW_HELD] < 0 ||
        held_pin < 0)
        goto out;
    kids[0] = sleeper(fd[INSIDE]);
    kids[1] = sleeper(below_pin);
    kids[2] = sleeper(held_pin);
    if (kids[0] < 0 || kids[1] < 0 || kids[2] < 0) {
        fprintf(stderr, "clone3 into a cgroup: %s\n", strerror(errno));
        goto out;
    }
    /* What keeper.c's hold_procs_files keeps: the target's cgroup.procs
     * (the lowest cgroup above target and us is the same for every place,
     * so it is no difference between them) */
    char procs[4300];
    snprintf(procs, sizeof procs, "%s/held/cgroup.procs", base);
    if (open(procs, O_PATH | O_CLOEXEC) < 0)
        fprintf(stderr, "open %s: %s\n", procs, strerror(errno));
    double *t[NPLACES], *c[NPLACES];
    for (int p = 0; p < NPLACES; p++) {
        t[p] = calloc((size_t)rounds, sizeof(double));
        c[p] = calloc((size_t)rounds, sizeof(double));
        if (!t[p] || !c[p])
            goto out;
    }
    for (int i = 0; i < rounds; i++)
        for (int j = 0; j < NPLACES; j++) {
            int p = (i + j) % NPLACES; /* each place goes first in turn */
            if (gap)
                usleep((useconds_t)gap);
            double t0 = now_us();
            pid_t pid = spawn(fd[p], &c[p][i]);
            if (pid < 0) {
                fprintf(stderr, "clone3 (%s): %s\n", names[p], strerror(errno));
                goto out;
            }
            int st;
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
            }
            t[p][i] = now_us() - t0;
        }
    for (int p = 0; p < NPLACES; p++) {
        qsort(t[p], (size_t)rounds, sizeof(double), cmp);
        qsort(c[p], (size_t)rounds, sizeof(double), cmp);
        printf("%s\t%.1f\t%.1f\t%.1f\t%.1f\n", names[p], t[p][rounds / 2], t[p][rounds / 10],
               t[p][rounds * 9 / 10], c[p][rounds / 2]);
    }
    status = 0;
out:
    for (int k = 0; k < 3; k++)
        if (kids[k] > 0) {
            kill(kids[k], SIGKILL);
            while (waitpid(kids[k], NULL, 0) < 0 && errno == EINTR) {
            }
        }
    for (int k = ndirs - 1; k >= 0; k--) /* children first */
        for (int tries = 0; rmdir(dirs[k]) < 0 && errno == EBUSY && tries < 100; tries++)
            usleep(10000); /* a killed child leaves its cgroup just after its reap */
    return status;
}
