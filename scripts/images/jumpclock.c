/*
 * jumpclock: moves the wall clock of the process it is preloaded into, for the
 * clock-watch tests of dlock's Redis and Redlock backends.
 *
 *   LD_PRELOAD=/usr/local/lib/jumpclock.so JUMPCLOCK_FILE=/tmp/clock-offset redis-server
 *
 * The file holds an offset in milliseconds (negative: back in time; no file:
 * 0), re-read at most every 10 ms, so writing it makes the clock jump at once.
 * gettimeofday, time and clock_gettime on the wall clocks are shifted; the
 * monotonic clocks are not.
 *
 * Why not Debian's libfaketime: Debian's redis-server is linked with jemalloc,
 * and libfaketime 0.9.10 aborts it at start ("Cannot recover from unexpected
 * recursive calls to clock_gettime()"): its first clock call resolves the real
 * functions with dlsym, which allocates, and jemalloc's initialisation reads
 * the clock again. This shim calls the kernel directly and never allocates.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* glibc declares gettimeofday's first argument non-null; the kernel accepts NULL. */
#pragma GCC diagnostic ignored "-Wnonnull-compare"

static long long offset_us;
static long long checked_at_ns = -1000000000LL;

static int real_clock_gettime(clockid_t id, struct timespec *ts)
{
	return (int)syscall(SYS_clock_gettime, id, ts);
}

static long long parse_ms(const char *s, ssize_t n)
{
	long long v = 0;
	int neg = 0;
	ssize_t i = 0;
	while (i < n && (s[i] == ' ' || s[i] == '+'))
		i++;
	if (i < n && s[i] == '-') {
		neg = 1;
		i++;
	}
	for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
		v = v * 10 + (s[i] - '0');
	return neg ? -v : v;
}

static long long offset(void)
{
	struct timespec now;
	if (real_clock_gettime(CLOCK_MONOTONIC, &now) != 0)
		return __atomic_load_n(&offset_us, __ATOMIC_RELAXED);
	long long ns = now.tv_sec * 1000000000LL + now.tv_nsec;
	long long last = __atomic_load_n(&checked_at_ns, __ATOMIC_RELAXED);
	if (ns - last < 10000000LL)
		return __atomic_load_n(&offset_us, __ATOMIC_RELAXED);
	__atomic_store_n(&checked_at_ns, ns, __ATOMIC_RELAXED);
	const char *path = getenv("JUMPCLOCK_FILE");
	long long us = 0;
	if (path) {
		int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			char buf[32];
			ssize_t n = (ssize_t)syscall(SYS_read, fd, buf, sizeof buf);
			syscall(SYS_close, fd);
			if (n > 0)
				us = parse_ms(buf, n) * 1000;
		}
	}
	__atomic_store_n(&offset_us, us, __ATOMIC_RELAXED);
	return us;
}

static int is_wall(clockid_t id)
{
	return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
	int r = real_clock_gettime(id, ts);
	if (r == 0 && is_wall(id)) {
		long long ns = ts->tv_sec * 1000000000LL + ts->tv_nsec + offset() * 1000;
		ts->tv_sec = ns / 1000000000LL;
		ts->tv_nsec = ns % 1000000000LL;
	}
	return r;
}

int gettimeofday(struct timeval *tv, void *tz)
{
	int r = (int)syscall(SYS_gettimeofday, tv, tz);
	if (r == 0 && tv) {
		long long us = tv->tv_sec * 1000000LL + tv->tv_usec + offset();
		tv->tv_sec = us / 1000000LL;
		tv->tv_usec = us % 1000000LL;
	}
	return r;
}

time_t time(time_t *t)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return (time_t)-1;
	if (t)
		*t = ts.tv_sec;
	return ts.tv_sec;
}
