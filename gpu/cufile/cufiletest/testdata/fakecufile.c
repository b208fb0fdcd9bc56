/*
 * A stand-in for libcufile.so.0 on machines without a GPU, for tests only,
 * next to the stand-in CUDA driver (gpu/cuda/cudatest), whose "device
 * memory" is host memory at the addresses it hands out as device pointers:
 * a read here is a pread to that address. It checks what the real library
 * would refuse (use before cuFileDriverOpen, unknown handles, a range past
 * a registered buffer, double registration), reports the mode it is told
 * to (compatibility by default: no nvidia-fs), and can be told to fail
 * reads; it says nothing of GPUDirect Storage's speed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } CUfileDescr_t;
typedef struct {
    struct {
        unsigned int major_version, minor_version;
        size_t poll_thresh_size, max_direct_io_size;
        unsigned int dstatusflags, dcontrolflags;
    } nvfs;
    unsigned int fflags, max_device_cache_size, per_buffer_cache_size, max_device_pinned_mem_size,
        max_batch_io_size, max_batch_io_timeout_msecs;
} CUfileDrvProps_t;
typedef void *CUfileHandle_t;

enum { OK = 0, NOT_INITIALIZED = 5001, INVALID_MAPPING_RANGE = 5017, INVALID_FILE_TYPE = 5018,
       INVALID_VALUE = 5022, ALREADY_REGISTERED = 5023, NOT_REGISTERED = 5024, HANDLE_NOT_REGISTERED = 5027 };

static CUfileError_t st(int e) { CUfileError_t s = { e, 0 }; return s; }

static int opened, gds, fail_next;
static long reads;

#define MAXH 256
struct h { int fd, live; };
static struct h handles[MAXH];
#define MAXB 64
static struct { char *p; size_t n; } bufs[MAXB];

CUfileError_t cuFileDriverOpen(void) { opened = 1; return st(OK); }
CUfileError_t cuFileDriverClose_v2(void) { if (!opened) return st(NOT_INITIALIZED); opened = 0; return st(OK); }
CUfileError_t cuFileDriverClose(void) { return cuFileDriverClose_v2(); }
CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t *p) {
    if (!opened) return st(NOT_INITIALIZED);
    memset(p, 0, sizeof *p);
    if (gds) { p->nvfs.major_version = 2; p->nvfs.minor_version = 17; p->nvfs.max_direct_io_size = 16384; }
    return st(OK);
}
CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *d) {
    if (!opened) return st(NOT_INITIALIZED);
    if (!d || d->type != 1 || d->fs_ops) return st(INVALID_VALUE);
    if (fcntl(d->handle.fd, F_GETFL) < 0) return st(INVALID_FILE_TYPE);
    for (int i = 0; i < MAXH; i++) if (!handles[i].live) {
        handles[i].fd = d->handle.fd; handles[i].live = 1; *fh = &handles[i]; return st(OK);
    }
    return st(INVALID_VALUE);
}
static int live(CUfileHandle_t fh) {
    for (int i = 0; i < MAXH; i++) if (fh == &handles[i]) return handles[i].live;
    return 0;
}
void cuFileHandleDeregister(CUfileHandle_t fh) { if (live(fh)) ((struct h *)fh)->live = 0; }
CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags) {
    (void)flags;
    if (!opened) return st(NOT_INITIALIZED);
    if (!p || !n) return st(INVALID_VALUE);
    for (int i = 0; i < MAXB; i++) if (bufs[i].p && (const char *)p < bufs[i].p + bufs[i].n && bufs[i].p < (const char *)p + n)
        return st(ALREADY_REGISTERED);
    for (int i = 0; i < MAXB; i++) if (!bufs[i].p) { bufs[i].p = (char *)p; bufs[i].n = n; return st(OK); }
    return st(INVALID_VALUE);
}
CUfileError_t cuFileBufDeregister(const void *p) {
    for (int i = 0; i < MAXB; i++) if (bufs[i].p == p) { bufs[i].p = 0; return st(OK); }
    return st(NOT_REGISTERED);
}
/* check returns 0 or the error of an I/O of n bytes at base+off. */
static int check(CUfileHandle_t fh, const void *base, size_t n, off_t foff, off_t off) {
    if (!opened) return NOT_INITIALIZED;
    if (!live(fh)) return HANDLE_NOT_REGISTERED;
    if (!base || foff < 0 || off < 0) return INVALID_VALUE;
    for (int i = 0; i < MAXB; i++) if (bufs[i].p == base && (size_t)off + n > bufs[i].n) return INVALID_MAPPING_RANGE;
    return 0;
}
ssize_t cuFileRead(CUfileHandle_t fh, void *base, size_t n, off_t foff, off_t off) {
    int e = check(fh, base, n, foff, off);
    if (e) return -e;
    int fd = ((struct h *)fh)->fd;
    char *dst = (char *)base + off;
    reads++;
    if (fail_next > 0) { /* half the bytes arrive, then the disk fails */
        fail_next--;
        if (pread(fd, dst, n / 2, foff) < 0) return -1;
        errno = EIO;
        return -1;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, dst + done, n - done, foff + done);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        if (r == 0) break;
        done += r;
    }
    return done;
}
ssize_t cuFileWrite(CUfileHandle_t fh, const void *base, size_t n, off_t foff, off_t off) {
    int e = check(fh, base, n, foff, off);
    if (e) return -e;
    int fd = ((struct h *)fh)->fd;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pwrite(fd, (const char *)base + off + done, n - done, foff + done);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        done += r;
    }
    return done;
}
/* Test hook: the next n reads fail with EIO after half their bytes. */
void fakecufile_fail_reads(int n) { fail_next = n; }
/* Test hook: report GDS mode (nvidia-fs loaded) when on, else compatibility mode. */
void fakecufile_set_gds(int on) { gds = on; }
/* Test hook: handles registered now. */
int fakecufile_handles(void) { int n = 0; for (int i = 0; i < MAXH; i++) n += handles[i].live; return n; }
/* Test hook: buffer bytes registered now. */
size_t fakecufile_registered(void) { size_t n = 0; for (int i = 0; i < MAXB; i++) if (bufs[i].p) n += bufs[i].n; return n; }
/* Test hook: reads made so far. */
long fakecufile_reads(void) { return reads; }
