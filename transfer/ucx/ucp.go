//go:build ucx

package ucx

// This file is the whole cgo surface of the package: a few small C helpers
// around UCP and the Go functions that call them. Every UCP call of the
// package goes through here, with the worker's mutex held (worker.go): the
// worker runs in UCS_THREAD_MODE_SERIALIZED, one call at a time from
// whichever thread holds the mutex.
//
// No Go callback is ever called from C. UCX completion callbacks are the C
// functions below: they append a plain-integer event (op id, status, length,
// sender tag) to the C event array of the worker being called (a
// thread-local pointer every helper sets on entry), and the Go side reads
// the array after each call that may have run callbacks. The op id travels as the callback's
// user_data: an integer, never a pointer. Receives ask UCX never to
// complete them inline (UCP_OP_ATTR_FLAG_NO_IMM_CMPL), because UCX 1.13
// reports no length for a receive that completes inside the call; so every
// receive completes through its callback, with the length and sender tag.

/*
#cgo LDFLAGS: -lucp -lucs
#include <ucp/api/ucp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// kv_event is one completion: of an op (id), or an endpoint error (id 0,
// tag = the endpoint's handle).
typedef struct {
	uint64_t id;
	int64_t  status;
	uint64_t length;
	uint64_t tag;
} kv_event;

typedef struct {
	ucp_context_h ctx;
	ucp_worker_h  worker;
	int           efd;
	kv_event     *ev;
	size_t        nev, cap;
	uint64_t      memtypes; // the memory types the context can move (UCS_MEMORY_TYPE_*)
} kv_worker;

// Steps of kv_open, for the error that says which one failed.
enum { KV_STEP_CONFIG = 1, KV_STEP_MODIFY, KV_STEP_INIT, KV_STEP_WORKER, KV_STEP_EFD };

static int kv_grow(kv_worker *w, size_t need) {
	if (need <= w->cap) {
		return 0;
	}
	size_t cap = w->cap ? w->cap : 64;
	while (cap < need) {
		cap *= 2;
	}
	kv_event *ev = realloc(w->ev, cap * sizeof(*ev));
	if (ev == NULL) {
		return -1;
	}
	w->ev = ev;
	w->cap = cap;
	return 0;
}

// kv_cur is the worker whose call runs on this thread: every helper that
// may run callbacks sets it first. Calls on one worker are serialized by
// the Go side, so callbacks always find their own worker here.
static __thread kv_worker *kv_cur;

static void kv_push(kv_worker *w, uint64_t id, ucs_status_t st, uint64_t len, uint64_t tag) {
	if (w == NULL) {
		fprintf(stderr, "kvstrata/ucx: a UCX callback ran off its worker's thread\n");
		abort();
	}
	// The loop reserves room for every op it posts; growing here is the
	// fallback for the unexpected.
	if (w->nev == w->cap && kv_grow(w, w->nev + 1) != 0) {
		fprintf(stderr, "kvstrata/ucx: out of memory for completion events\n");
		abort();
	}
	kv_event *e = &w->ev[w->nev++];
	e->id = id;
	e->status = st;
	e->length = len;
	e->tag = tag;
}

static void kv_send_cb(void *req, ucs_status_t st, void *user) {
	kv_push(kv_cur, (uint64_t)(uintptr_t)user, st, 0, 0);
}

static void kv_recv_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user) {
	uint64_t len = 0, tag = 0;
	if (info != NULL && (st == UCS_OK || st == UCS_ERR_MESSAGE_TRUNCATED)) {
		len = info->length;
		tag = info->sender_tag;
	}
	kv_push(kv_cur, (uint64_t)(uintptr_t)user, st, len, tag);
}

static void kv_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st) {
	kv_push((kv_worker *)arg, 0, st, 0, (uint64_t)(uintptr_t)ep);
}

// kv_open makes a context with the given settings and one worker on it. On
// failure it returns the status and sets *step; nothing is left allocated.
static ucs_status_t kv_open(kv_worker **out, char **keys, char **vals, int n, int *step, int *bad) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		*step = KV_STEP_CONFIG;
		return st;
	}
	for (int i = 0; i < n; i++) {
		st = ucp_config_modify(cfg, keys[i], vals[i]);
		if (st != UCS_OK) {
			ucp_config_release(cfg);
			*step = KV_STEP_MODIFY;
			*bad = i;
			return st;
		}
	}
	kv_worker *w = calloc(1, sizeof(*w));
	if (w == NULL || kv_grow(w, 256) != 0) {
		free(w);
		ucp_config_release(cfg);
		*step = KV_STEP_INIT;
		return UCS_ERR_NO_MEMORY;
	}
	ucp_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_PARAM_FIELD_FEATURES;
	p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
	st = ucp_init(&p, cfg, &w->ctx);
	ucp_config_release(cfg);
	if (st != UCS_OK) {
		free(w->ev);
		free(w);
		*step = KV_STEP_INIT;
		return st;
	}
	ucp_context_attr_t attr;
	memset(&attr, 0, sizeof(attr));
	attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
	if (ucp_context_query(w->ctx, &attr) == UCS_OK) {
		w->memtypes = attr.memory_types;
	}
	ucp_worker_params_t wp;
	memset(&wp, 0, sizeof(wp));
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
	st = ucp_worker_create(w->ctx, &wp, &w->worker);
	if (st == UCS_OK) {
		st = ucp_worker_get_efd(w->worker, &w->efd);
		if (st != UCS_OK) {
			ucp_worker_destroy(w->worker);
			*step = KV_STEP_EFD;
		}
	} else {
		*step = KV_STEP_WORKER;
	}
	if (st != UCS_OK) {
		ucp_cleanup(w->ctx);
		free(w->ev);
		free(w);
		return st;
	}
	*out = w;
	return UCS_OK;
}

static void kv_close(kv_worker *w) {
	kv_cur = w; // destroying may complete what is left
	ucp_worker_destroy(w->worker);
	kv_cur = NULL;
	ucp_cleanup(w->ctx);
	free(w->ev);
	free(w);
}

// kv_address copies the worker's address into a malloc'd buffer.
static ucs_status_t kv_address(kv_worker *w, void **buf, size_t *len) {
	ucp_address_t *a;
	ucs_status_t st = ucp_worker_get_address(w->worker, &a, len);
	if (st != UCS_OK) {
		return st;
	}
	*buf = malloc(*len);
	if (*buf != NULL) {
		memcpy(*buf, a, *len);
	} else {
		st = UCS_ERR_NO_MEMORY;
	}
	ucp_worker_release_address(w->worker, a);
	return st;
}

static ucs_status_t kv_ep_create(kv_worker *w, const void *addr, ucp_ep_h *ep) {
	kv_cur = w;
	ucp_ep_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	               UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	p.err_handler.cb = kv_ep_err_cb;
	p.err_handler.arg = w;
	return ucp_ep_create(w->worker, &p, ep);
}

// kv_post is what posting an operation gave: its status, UCS_OK (done at
// once, no callback), UCS_INPROGRESS (req is set; its callback comes, maybe
// already came) or an error. Helpers return it by value, so that no Go
// variable's address goes to C on the hot path.
typedef struct {
	void   *req;
	int64_t status;
} kv_post;

static kv_post kv_finish(ucs_status_ptr_t r) {
	kv_post p = {NULL, UCS_OK};
	if (r == NULL) {
		return p;
	}
	if (UCS_PTR_IS_ERR(r)) {
		p.status = UCS_PTR_STATUS(r);
		return p;
	}
	p.req = r;
	p.status = UCS_INPROGRESS;
	return p;
}

static void kv_param(kv_worker *w, ucp_request_param_t *p, uint64_t id) {
	kv_cur = w;
	memset(p, 0, sizeof(*p));
	p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p->user_data = (void *)(uintptr_t)id;
}

static kv_post kv_ep_close(kv_worker *w, ucp_ep_h ep, uint64_t id) {
	ucp_request_param_t p;
	kv_param(w, &p, id);
	p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_EP_CLOSE_FLAG_FORCE;
	p.cb.send = kv_send_cb;
	return kv_finish(ucp_ep_close_nbx(ep, &p));
}

static kv_post kv_ep_flush(kv_worker *w, ucp_ep_h ep, uint64_t id) {
	ucp_request_param_t p;
	kv_param(w, &p, id);
	p.cb.send = kv_send_cb;
	return kv_finish(ucp_ep_flush_nbx(ep, &p));
}

static kv_post kv_send(kv_worker *w, ucp_ep_h ep, const void *buf, size_t len, uint64_t tag, uint64_t id) {
	ucp_request_param_t p;
	kv_param(w, &p, id);
	p.cb.send = kv_send_cb;
	return kv_finish(ucp_tag_send_nbx(ep, buf, len, tag, &p));
}

// kv_send_dev and kv_recv_dev are kv_send and kv_recv for a buffer in CUDA
// device memory, said so in the request (UCX then skips its detection).
static kv_post kv_send_dev(kv_worker *w, ucp_ep_h ep, uint64_t ptr, size_t len, uint64_t tag, uint64_t id) {
	ucp_request_param_t p;
	kv_param(w, &p, id);
	p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
	p.memory_type = UCS_MEMORY_TYPE_CUDA;
	p.cb.send = kv_send_cb;
	return kv_finish(ucp_tag_send_nbx(ep, (const void *)(uintptr_t)ptr, len, tag, &p));
}

static kv_post kv_recv_dev(kv_worker *w, uint64_t ptr, size_t len, uint64_t tag, uint64_t mask, uint64_t id) {
	ucp_request_param_t p;
	kv_param(w, &p, id);
	p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
	p.memory_type = UCS_MEMORY_TYPE_CUDA;
	p.cb.recv = kv_recv_cb;
	return kv_finish(ucp_tag_recv_nbx(w->worker, (void *)(uintptr_t)ptr, len, tag, mask, &p));
}

static kv_post kv_recv(kv_worker *w, void *buf, size_t len, uint64_t tag, uint64_t mask, uint64_t id) {
	ucp_request_param_t p;
	kv_param(w, &p, id);
	p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
	p.cb.recv = kv_recv_cb;
	return kv_finish(ucp_tag_recv_nbx(w->worker, buf, len, tag, mask, &p));
}

typedef struct {
	ucp_tag_message_h msg;
	uint64_t          length, tag;
} kv_probed;

// kv_probe takes the first unexpected message matching tag/mask off the
// queue; msg is NULL when there is none.
static kv_probed kv_probe(kv_worker *w, uint64_t tag, uint64_t mask) {
	kv_cur = w;
	ucp_tag_recv_info_t info;
	kv_probed p = {NULL, 0, 0};
	p.msg = ucp_tag_probe_nb(w->worker, tag, mask, 1, &info);
	if (p.msg != NULL) {
		p.length = info.length;
		p.tag = info.sender_tag;
	}
	return p;
}

static kv_post kv_msg_recv(kv_worker *w, void *buf, size_t len, ucp_tag_message_h m, uint64_t id) {
	ucp_request_param_t p;
	kv_param(w, &p, id);
	p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
	p.cb.recv = kv_recv_cb;
	return kv_finish(ucp_tag_msg_recv_nbx(w->worker, buf, len, m, &p));
}

static unsigned kv_progress(kv_worker *w) {
	kv_cur = w;
	unsigned total = 0, n;
	int rounds = 0;
	while ((n = ucp_worker_progress(w->worker)) != 0 && rounds++ < 64) {
		total += n;
	}
	return total;
}

static void kv_cancel(kv_worker *w, void *req) {
	kv_cur = w;
	ucp_request_cancel(w->worker, req);
}

static ucs_status_t kv_arm(kv_worker *w) {
	kv_cur = w;
	return ucp_worker_arm(w->worker);
}

// kv_ep_info returns what ucp_ep_print_info says of ep, malloc'd.
static char *kv_ep_info(ucp_ep_h ep, size_t *len) {
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len);
	if (f == NULL) {
		return NULL;
	}
	ucp_ep_print_info(ep, f);
	fclose(f);
	return buf;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// ucsStatus is a ucs_status_t.
type ucsStatus int64

const (
	ucsOK         = ucsStatus(C.UCS_OK)
	ucsInProgress = ucsStatus(C.UCS_INPROGRESS)
	ucsBusy       = ucsStatus(C.UCS_ERR_BUSY)
	ucsCanceled   = ucsStatus(C.UCS_ERR_CANCELED)
	ucsTruncated  = ucsStatus(C.UCS_ERR_MESSAGE_TRUNCATED)
	ucsNoMemory   = ucsStatus(C.UCS_ERR_NO_MEMORY)
)

// ErrUCX marks a failure UCX reported; the message says what failed and
// carries UCX's own words for it.
var ErrUCX = errors.New("ucx")

// ucxError is a UCX status as an error.
type ucxError struct{ st ucsStatus }

func (e ucxError) Error() string {
	return "UCX: " + C.GoString(C.ucs_status_string(C.ucs_status_t(e.st)))
}

func (e ucxError) Is(target error) bool { return target == ErrUCX }

func (s ucsStatus) err() error {
	if s == ucsOK {
		return nil
	}
	return ucxError{s}
}

// cworker is a context with its one worker and its event array.
type cworker = C.kv_worker

// epHandle is a ucp_ep_h, as the loop keeps it.
type epHandle = C.ucp_ep_h

// event is one completion the C callbacks recorded.
type event = C.kv_event

// openWorker makes a UCP context configured with settings and one worker on
// it (thread mode single: only the calling loop thread touches it).
func openWorker(settings [][2]string) (*cworker, error) {
	keys := make([]*C.char, len(settings))
	vals := make([]*C.char, len(settings))
	for i, kv := range settings {
		keys[i], vals[i] = C.CString(kv[0]), C.CString(kv[1])
	}
	defer func() {
		for i := range keys {
			C.free(unsafe.Pointer(keys[i]))
			C.free(unsafe.Pointer(vals[i]))
		}
	}()
	var kp, vp **C.char
	if len(keys) > 0 {
		// C memory would do too; these Go arrays hold only C pointers and
		// C does not keep them past the call.
		kp, vp = &keys[0], &vals[0]
	}
	var w *C.kv_worker
	var step, bad C.int
	st := ucsStatus(C.kv_open(&w, kp, vp, C.int(len(keys)), &step, &bad))
	if st == ucsOK {
		return w, nil
	}
	what := map[C.int]string{
		C.KV_STEP_CONFIG: "read the UCX configuration",
		C.KV_STEP_INIT:   "initialize a UCP context",
		C.KV_STEP_WORKER: "create a UCP worker",
		C.KV_STEP_EFD:    "get the worker's event file descriptor",
	}[step]
	if step == C.KV_STEP_MODIFY {
		what = fmt.Sprintf("set UCX_%s=%q", settings[bad][0], settings[bad][1])
	}
	return nil, fmt.Errorf("%s: %w", what, st.err())
}

func closeWorker(w *cworker) { C.kv_close(w) }

// deviceMemory reports whether the UCX in use can move CUDA device memory
// (a build with cuda_copy / cuda_ipc): Debian's is built without.
func deviceMemory(w *cworker) bool { return w.memtypes&(1<<C.UCS_MEMORY_TYPE_CUDA) != 0 }

func workerFD(w *cworker) int { return int(w.efd) }

func workerAddress(w *cworker) ([]byte, error) {
	var buf unsafe.Pointer
	var n C.size_t
	if st := ucsStatus(C.kv_address(w, &buf, &n)); st != ucsOK {
		return nil, fmt.Errorf("get the worker's address: %w", st.err())
	}
	defer C.free(buf)
	return C.GoBytes(buf, C.int(n)), nil
}

// createEP connects an endpoint to the worker at addr. The address is
// copied into C memory: UCX reads it only during the call, but unpacking
// it walks the bytes with C pointers.
func createEP(w *cworker, addr []byte) (epHandle, error) {
	c := C.CBytes(addr)
	defer C.free(c)
	var ep C.ucp_ep_h
	if st := ucsStatus(C.kv_ep_create(w, c, &ep)); st != ucsOK {
		return nil, fmt.Errorf("connect an endpoint: %w", st.err())
	}
	return ep, nil
}

func closeEP(w *cworker, ep epHandle, id uint64) (unsafe.Pointer, ucsStatus) {
	p := C.kv_ep_close(w, ep, C.uint64_t(id))
	return p.req, ucsStatus(p.status)
}

func flushEP(w *cworker, ep epHandle, id uint64) (unsafe.Pointer, ucsStatus) {
	p := C.kv_ep_flush(w, ep, C.uint64_t(id))
	return p.req, ucsStatus(p.status)
}

// bufPtr returns the address of b's first byte, nil for an empty b.
func bufPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// The posting functions pass b's address to UCX, which keeps it until the
// op completes: the caller has pinned b (runtime.Pinner) for that long.

func postSend(w *cworker, ep epHandle, b []byte, tag, id uint64) (unsafe.Pointer, ucsStatus) {
	p := C.kv_send(w, ep, bufPtr(b), C.size_t(len(b)), C.uint64_t(tag), C.uint64_t(id))
	return p.req, ucsStatus(p.status)
}

func postRecv(w *cworker, b []byte, tag, mask, id uint64) (unsafe.Pointer, ucsStatus) {
	p := C.kv_recv(w, bufPtr(b), C.size_t(len(b)), C.uint64_t(tag), C.uint64_t(mask), C.uint64_t(id))
	return p.req, ucsStatus(p.status)
}

// postSendDev and postRecvDev post n bytes of CUDA device memory at ptr:
// not Go memory, nothing to pin.
func postSendDev(w *cworker, ep epHandle, ptr uint64, n int, tag, id uint64) (unsafe.Pointer, ucsStatus) {
	p := C.kv_send_dev(w, ep, C.uint64_t(ptr), C.size_t(n), C.uint64_t(tag), C.uint64_t(id))
	return p.req, ucsStatus(p.status)
}

func postRecvDev(w *cworker, ptr uint64, n int, tag, mask, id uint64) (unsafe.Pointer, ucsStatus) {
	p := C.kv_recv_dev(w, C.uint64_t(ptr), C.size_t(n), C.uint64_t(tag), C.uint64_t(mask), C.uint64_t(id))
	return p.req, ucsStatus(p.status)
}

// probe takes the first unexpected message that matches tag under mask.
func probe(w *cworker, tag, mask uint64) (msg unsafe.Pointer, n int, stag uint64) {
	p := C.kv_probe(w, C.uint64_t(tag), C.uint64_t(mask))
	return unsafe.Pointer(p.msg), int(p.length), uint64(p.tag)
}

func postMsgRecv(w *cworker, b []byte, msg unsafe.Pointer, id uint64) (unsafe.Pointer, ucsStatus) {
	p := C.kv_msg_recv(w, bufPtr(b), C.size_t(len(b)), C.ucp_tag_message_h(msg), C.uint64_t(id))
	return p.req, ucsStatus(p.status)
}

func cancel(w *cworker, req unsafe.Pointer) { C.kv_cancel(w, req) }

func freeRequest(req unsafe.Pointer) { C.ucp_request_free(req) }

func progress(w *cworker) int { return int(C.kv_progress(w)) }

func arm(w *cworker) ucsStatus { return ucsStatus(C.kv_arm(w)) }

// reserveEvents makes room for n events.
func reserveEvents(w *cworker, n int) bool { return C.kv_grow(w, C.size_t(n)) == 0 }

func eventCap(w *cworker) int { return int(w.cap) }

// takeEvents appends the events recorded since the last call to dst.
func takeEvents(w *cworker, dst []event) []event {
	n := int(w.nev)
	if n == 0 {
		return dst
	}
	dst = append(dst, unsafe.Slice(w.ev, n)...)
	w.nev = 0
	return dst
}

func eventFields(e *event) (id uint64, st ucsStatus, n int, tag uint64) {
	return uint64(e.id), ucsStatus(e.status), int(e.length), uint64(e.tag)
}

// epInfo returns ucp_ep_print_info's text for ep.
func epInfo(ep epHandle) string {
	var n C.size_t
	p := C.kv_ep_info(ep, &n)
	if p == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(p))
	return C.GoStringN(p, C.int(n))
}

func epKey(ep epHandle) uint64 { return uint64(uintptr(unsafe.Pointer(ep))) }
