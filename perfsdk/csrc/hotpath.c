/* perfsdk._native.Hot, Step, LastEnd: the hot path in C.
 *
 * What `with mon.decode(...)` runs on the serving thread, every step, is the algorithm of
 * perfsdk/hotpath.py's Step (read that first: it is the specification, and tests/test_monitor.py and
 * tests/test_cuda_steps.py run every test on both): a clock read, a pooled CUDA event recorded on the
 * current stream (or the thread's previous end event reused as this step's start), an NVTX push/pop when
 * on, and one StepRecord written into the step core's ring. Done in C it costs a fraction of the Python:
 * no frame, no bytecode, no attribute lookups by name, cuEventRecord and cuStreamIsCapturing called
 * through their addresses, events as slots of the core's pool with atomic reference counts, and the
 * record a struct copy — no Python object per step beyond the Step itself.
 *
 * Everything that is not the steady path calls back into Python: validation of odd sizes, the
 * decorator, the profiler window's hooks, error recording, making a context current on a new thread.
 * Nothing here releases the GIL, so the counters below need no lock and pushes to the ring are
 * serialised.
 *
 * Types:
 *   Hot      one per Monitor, built from a perfsdk.hotpath.HotState (the same fields, read once) by the
 *            Monitor's perfsdk.recorder.NativeRecorder, which alone sets its window; hot.step(...) makes a Step.
 *   Step     one `with`: __enter__, __exit__, __call__ (decorator), tokens() (the requests it emitted a
 *            token for: one perfsdk.records.Tokens event at exit, whatever the batch).
 *   LastEnd  one per serving thread (in a threading.local): the thread's last timed step's end event.
 *
 * It runs over 500 lines on purpose: one translation unit for the hot path, so that the steady path (enter,
 * exit, the clock, the record, the ring push) compiles into a few inlined calls without exported symbols.
 */
#include "native.h"

#include <structmember.h>
#include <time.h>

#define STATE_IDLE 0
#define STATE_OPEN 1
#define STATE_SKIPPED 2

/* Keep the current exception aside while calling Python, then put it back. */
typedef struct { PyObject *a, *b, *c; } saved_exc;

static inline saved_exc exc_save(void) {
    saved_exc s = {NULL, NULL, NULL};
#if PY_VERSION_HEX >= 0x030C0000
    s.a = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&s.a, &s.b, &s.c);
#endif
    return s;
}

static inline void exc_restore(saved_exc s) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(s.a);
#else
    PyErr_Restore(s.a, s.b, s.c);
#endif
}

static PyObject *str_wants_steps, *str_step_begin, *str_step_end, *str_h, *str_qualname, *str_prefill, *str_decode,
    *str_mixed, *str_enter_where, *str_exit_where, *str_nvtx_where, *str_n, *str_step, *str_step_tokens,
    *str_tokens_where;
static PyTypeObject LastEndType, StepType, HotType;

/* ------------------------------------------------------------------------------------------ LastEnd */

typedef struct {
    PyObject_HEAD
    int32_t ev;        /* the end event slot of this thread's last timed step, or NO_EVENT */
    uintptr_t stream;  /* its stream */
    long long t1;      /* its host exit time */
    long long seq;     /* its exit number */
    PyObject *core;    /* the StepCore whose pool holds the event */
} LastEnd;

static PyObject *lastend_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *core;
    if (!PyArg_ParseTuple(args, "O:LastEnd", &core)) return NULL;
    if (core != Py_None && !PyObject_TypeCheck(core, &StepCoreType)) {
        PyErr_SetString(PyExc_TypeError, "LastEnd(core): a perfsdk._native.StepCore");
        return NULL;
    }
    LastEnd *self = PyObject_GC_New(LastEnd, type);
    if (!self) return NULL;
    self->ev = NO_EVENT;
    self->stream = 0;
    self->t1 = 0;
    self->seq = -1;
    self->core = core == Py_None ? NULL : Py_NewRef(core);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int lastend_traverse(LastEnd *self, visitproc visit, void *arg) {
    Py_VISIT(self->core);
    return 0;
}

static void lastend_release(LastEnd *self) {
    /* the thread ended (its threading.local went): it lets go of its last end event */
    if (self->ev != NO_EVENT && self->core) core_unref((StepCore *)self->core, self->ev);
    self->ev = NO_EVENT;
}

static int lastend_clear(LastEnd *self) {
    lastend_release(self);
    Py_CLEAR(self->core);
    return 0;
}

static void lastend_dealloc(LastEnd *self) {
    PyObject_GC_UnTrack(self);
    lastend_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *lastend_get_ev(LastEnd *self, void *_) {
    return self->ev == NO_EVENT ? Py_NewRef(Py_None) : PyLong_FromLong(self->ev);
}

static int lastend_set_ev(LastEnd *self, PyObject *v, void *_) {
    if (v == NULL || v == Py_None) {  /* "none held", written from Python: the thread lets go */
        lastend_release(self);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "LastEnd.ev can only be cleared (None)");
    return -1;
}

static PyGetSetDef lastend_getset[] = {
    {"ev", (getter)lastend_get_ev, (setter)lastend_set_ev, "the last timed step's end event slot (None: none)", NULL},
    {NULL}};

static PyMemberDef lastend_members[] = {
    {"t1", T_LONGLONG, offsetof(LastEnd, t1), READONLY, "its host exit time (ns)"},
    {"seq", T_LONGLONG, offsetof(LastEnd, seq), READONLY, "its exit number"},
    {NULL}};

static PyTypeObject LastEndType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "perfsdk._native.LastEnd",
    .tp_doc = "One serving thread's last timed step: its end event, stream, exit time and exit number.",
    .tp_basicsize = sizeof(LastEnd),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = lastend_new,
    .tp_dealloc = (destructor)lastend_dealloc,
    .tp_traverse = (traverseproc)lastend_traverse,
    .tp_clear = (inquiry)lastend_clear,
    .tp_members = lastend_members,
    .tp_getset = lastend_getset,
};

/* ---------------------------------------------------------------------------------------------- Hot */

typedef struct {
    PyObject_HEAD
    StepCore *core;
    PyObject *clock;          /* () -> int ns; NULL: CLOCK_MONOTONIC (what time.perf_counter_ns reads on Linux) */
    PyObject *capturing;      /* () -> bool, or NULL */
    cu_is_capturing_t is_capturing_fn;
    PyObject *stream;         /* () -> the current stream's handle, or NULL (host timing) */
    cu_record_t record_fn;
    PyObject *raise_for;      /* (code) -> raises */
    PyObject *ensure_context; /* () -> None, or NULL */
    PyObject *errors_record;  /* (exc, where) */
    PyObject *local;          /* threading.local whose .h is this thread's LastEnd */
    int nvtx_on;
    PyObject *nvtx_push, *nvtx_pop;
    PyObject *window;         /* the profiler window or None (set by the Recorder's set_window only) */
    PyObject *decorate;       /* (step, fn) -> wrapped fn */
    PyObject *slow_step;      /* (phase, batch, tokens, context_tokens, seq_lens) -> a step */
    long long chain_gap_ns;
    long long every;
    long long count;          /* steps entered (for every) */
    long long last_exit;      /* exit number of the latest timed step (0: an untimed one came after it) */
    long long exit_seq;
    long long event_pool_empty; /* steps counted but not timed because every event was in flight */
    int timed;                /* the core has events */
    int strict;               /* bad values raise (perfsdk.testing): step.tokens() checks every request */
    PyObject *requests_push;  /* the request queue's push(event), or NULL: step.tokens() records nowhere */
    PyObject *token_args;     /* its token_args(where, requests, n): the checks, for what is not plain */
    PyTypeObject *tokens_type;  /* perfsdk.records.Tokens */
} Hot;

static PyObject *opt_attr(PyObject *o, const char *name) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (v == Py_None) Py_CLEAR(v);
    return v;  /* NULL with an exception set, or NULL for None (no exception) */
}

static int hot_traverse(Hot *self, visitproc visit, void *arg) {
    Py_VISIT(self->core);
    Py_VISIT(self->clock);
    Py_VISIT(self->capturing);
    Py_VISIT(self->stream);
    Py_VISIT(self->raise_for);
    Py_VISIT(self->ensure_context);
    Py_VISIT(self->errors_record);
    Py_VISIT(self->local);
    Py_VISIT(self->nvtx_push);
    Py_VISIT(self->nvtx_pop);
    Py_VISIT(self->window);
    Py_VISIT(self->decorate);
    Py_VISIT(self->slow_step);
    Py_VISIT(self->requests_push);
    Py_VISIT(self->token_args);
    Py_VISIT(self->tokens_type);
    return 0;
}

static int hot_clear(Hot *self) {
    Py_CLEAR(self->core);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->capturing);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->raise_for);
    Py_CLEAR(self->ensure_context);
    Py_CLEAR(self->errors_record);
    Py_CLEAR(self->local);
    Py_CLEAR(self->nvtx_push);
    Py_CLEAR(self->nvtx_pop);
    Py_CLEAR(self->window);
    Py_CLEAR(self->decorate);
    Py_CLEAR(self->slow_step);
    Py_CLEAR(self->requests_push);
    Py_CLEAR(self->token_args);
    Py_CLEAR(self->tokens_type);
    return 0;
}

static void hot_dealloc(Hot *self) {
    PyObject_GC_UnTrack(self);
    hot_clear(self);
    PyObject_GC_Del(self);
}

/* Hot(state): bind the fields of a perfsdk.hotpath.HotState. */
static PyObject *hot_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *st;
    if (!PyArg_ParseTuple(args, "O:Hot", &st)) return NULL;
    Hot *self = PyObject_GC_New(Hot, type);
    if (!self) return NULL;
    memset((char *)self + sizeof(PyObject), 0, sizeof(Hot) - sizeof(PyObject));
    PyObject_GC_Track(self);
    int ok = 1;
    PyObject *core = PyObject_GetAttrString(st, "core");
    if (!core) goto fail;
    if (!PyObject_TypeCheck(core, &StepCoreType)) {
        Py_DECREF(core);
        PyErr_SetString(PyExc_TypeError, "Hot: state.core must be a perfsdk._native.StepCore");
        goto fail;
    }
    self->core = (StepCore *)core;
    self->timed = core_has_events(self->core);
#define OPT(field, name) if (!(self->field = opt_attr(st, name)) && PyErr_Occurred()) goto fail
    OPT(clock, "clock");
    OPT(capturing, "capturing");
    OPT(stream, "stream");
    OPT(raise_for, "raise_for");
    OPT(ensure_context, "ensure_context");
    OPT(local, "local");
    OPT(nvtx_push, "nvtx_push");
    OPT(nvtx_pop, "nvtx_pop");
    OPT(decorate, "decorate");
    OPT(slow_step, "slow_step");
#undef OPT
    PyObject *errors = PyObject_GetAttrString(st, "errors");
    if (!errors) goto fail;
    self->errors_record = PyObject_GetAttrString(errors, "record");
    Py_DECREF(errors);
    if (!self->errors_record) goto fail;
    self->window = Py_NewRef(Py_None);
    self->is_capturing_fn = (cu_is_capturing_t)attr_address(st, "is_capturing_fn", &ok);
    self->record_fn = (cu_record_t)attr_address(st, "record_fn", &ok);
    self->nvtx_on = (int)attr_ll(st, "nvtx_on", &ok);
    self->chain_gap_ns = attr_ll(st, "chain_gap_ns", &ok);
    self->every = attr_ll(st, "every", &ok);
    self->event_pool_empty = attr_ll(st, "event_pool_empty", &ok);  /* what a previous binding counted */
    self->strict = attr_ll(st, "strict", &ok) != 0;
    if (!ok) goto fail;
    PyObject *requests = opt_attr(st, "requests");
    if (requests) {
        self->requests_push = PyObject_GetAttrString(requests, "push");
        self->token_args = self->requests_push ? PyObject_GetAttrString(requests, "token_args") : NULL;
        Py_DECREF(requests);
        PyObject *records = self->token_args ? PyImport_ImportModule("perfsdk.records") : NULL;
        PyObject *tokens = records ? PyObject_GetAttrString(records, "Tokens") : NULL;
        Py_XDECREF(records);
        if (!tokens) goto fail;
        if (!PyType_Check(tokens) || !PyType_IsSubtype((PyTypeObject *)tokens, &PyTuple_Type)) {
            Py_DECREF(tokens);
            PyErr_SetString(PyExc_TypeError, "Hot: perfsdk.records.Tokens must be a NamedTuple");
            goto fail;
        }
        self->tokens_type = (PyTypeObject *)tokens;
    } else if (PyErr_Occurred()) {
        goto fail;
    }
    if (!self->local || !self->slow_step || !self->decorate || !self->errors_record) {
        PyErr_SetString(PyExc_ValueError, "Hot: state needs local, slow_step, decorate and errors");
        goto fail;
    }
    if (self->every < 1) {
        PyErr_SetString(PyExc_ValueError, "Hot: every must be >= 1");
        goto fail;
    }
    if (self->timed && (!self->record_fn || !self->stream || !self->raise_for)) {
        PyErr_SetString(PyExc_ValueError, "Hot: CUDA timing needs record_fn, stream and raise_for");
        goto fail;
    }
    if (self->nvtx_on && (!self->nvtx_push || !self->nvtx_pop)) {
        PyErr_SetString(PyExc_ValueError, "Hot: NVTX on needs nvtx_push and nvtx_pop");
        goto fail;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* The clock, as a C integer. -1 with an exception set on failure. */
static inline int now_ns(Hot *hot, long long *out) {
    if (hot->clock == NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *out = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(hot->clock);
    if (!r) return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* This thread has no current CUDA context (its first CUDA call is perfsdk's): make the events' context
   current, as the runtime would on the thread's first call. 0 when done, -1 (nothing set) when it cannot be. */
static int ensure_context(Hot *hot) {
    if (!hot->ensure_context) return -1;
    saved_exc saved = exc_save();
    PyObject *r = PyObject_CallNoArgs(hot->ensure_context);
    int rc = r ? 0 : -1;
    Py_XDECREF(r);
    PyErr_Clear();  /* the caller reports the original failure if the retry fails too */
    exc_restore(saved);
    return rc;
}

/* Record event slot on stream. 0, or -1 with an exception set (the driver's code goes through raise_for). */
static int record(Hot *hot, int32_t slot, uintptr_t stream) {
    void *e = (void *)core_handle(hot->core, slot);
    int code = hot->record_fn(e, (void *)stream);
    if (code == CUDA_ERROR_INVALID_CONTEXT && ensure_context(hot) == 0) code = hot->record_fn(e, (void *)stream);
    if (code == 0) return 0;
    PyObject *c = PyLong_FromLong(code);
    if (!c) return -1;
    PyObject *r = PyObject_CallOneArg(hot->raise_for, c);
    Py_DECREF(c);
    Py_XDECREF(r);
    if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "cuEventRecord failed (%d)", code);
    return -1;
}

/* An exception is set. An Exception: hand it to the Monitor's error guard and clear it (0). Anything
   else (KeyboardInterrupt, SystemExit): leave it set (-1), as `except Exception` would. */
static int swallow(Hot *hot, PyObject *phase, PyObject *suffix) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *ev = PyErr_GetRaisedException();
#else
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb && ev) PyException_SetTraceback(ev, tb);
    Py_XDECREF(et);
    Py_XDECREF(tb);
#endif
    PyObject *where = PyUnicode_Concat(phase, suffix);
    if (where && ev) {
        PyObject *r = PyObject_CallFunctionObjArgs(hot->errors_record, ev, where, NULL);
        Py_XDECREF(r);
    }
    Py_XDECREF(where);
    PyErr_Clear();  /* the guard itself failing must not reach the server either */
    Py_XDECREF(ev);
    return 0;
}

/* The thread's LastEnd, new reference, or NULL with an exception set. */
static LastEnd *thread_last(Hot *hot) {
    PyObject *h = PyObject_GetAttr(hot->local, str_h);
    if (!h) return NULL;
    if (!PyObject_TypeCheck(h, &LastEndType)) {
        Py_DECREF(h);
        PyErr_SetString(PyExc_TypeError, "perfsdk: the thread's step state is not a _native.LastEnd");
        return NULL;
    }
    return (LastEnd *)h;
}

/* The profiler window's hook, when a window is set and armed. */
static int window_hook(Hot *hot, PyObject *name, PyObject *phase) {
    PyObject *w = hot->window;
    if (w == NULL || w == Py_None) return 0;
    Py_INCREF(w);
    PyObject *flag = PyObject_GetAttr(w, str_wants_steps);
    int on = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    if (on > 0) {
        PyObject *r = PyObject_CallMethodOneArg(w, name, phase);
        on = r ? 0 : -1;
        Py_XDECREF(r);
    }
    Py_DECREF(w);
    return on < 0 ? -1 : 0;
}

/* --------------------------------------------------------------------------------------------- Step */

typedef struct {
    PyObject_HEAD
    Hot *hot;
    PyObject *phase;                      /* "prefill", "decode" or "mixed" */
    PyObject *batch, *tokens, *context_tokens, *seq_lens;  /* as given (for .sizes) */
    int32_t code;                         /* PHASE_* */
    int64_t nbatch, ntokens, ncontext, lens_sum, lens_sq, lens_count;
    int state;
    long long t0;
    int timed;                            /* 0: no events, 1: events held, -1: counted not timed */
    int32_t start, end;
    uintptr_t stream;
    PyObject *outer;  /* a list of (state, t0, timed, start, end, stream) of enclosing entries, or NULL */
    PyObject *emitted;       /* step.tokens(): a tuple of requests, pushed at exit; or NULL */
    int64_t emitted_n;       /* ... their tokens each */
    PyObject *emitted_more;  /* further tokens() calls in the same step: a list of (requests, n), or NULL */
} Step;

static int step_traverse(Step *self, visitproc visit, void *arg) {
    Py_VISIT(self->hot);
    Py_VISIT(self->batch);
    Py_VISIT(self->tokens);
    Py_VISIT(self->context_tokens);
    Py_VISIT(self->seq_lens);
    Py_VISIT(self->outer);
    Py_VISIT(self->emitted);
    Py_VISIT(self->emitted_more);
    return 0;
}

static int step_clear(Step *self) {
    Py_CLEAR(self->hot);
    Py_CLEAR(self->phase);
    Py_CLEAR(self->batch);
    Py_CLEAR(self->tokens);
    Py_CLEAR(self->context_tokens);
    Py_CLEAR(self->seq_lens);
    Py_CLEAR(self->outer);
    Py_CLEAR(self->emitted);
    Py_CLEAR(self->emitted_more);
    return 0;
}

static void step_dealloc(Step *self) {
    PyObject_GC_UnTrack(self);
    step_clear(self);
    PyObject_GC_Del(self);
}

static inline int plain_count(PyObject *o, int64_t *out) {
    /* an exact, non-negative int below 2**30: what nearly every caller passes (the rest is validated in
       Python) */
    if (!PyLong_CheckExact(o)) return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
    Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)o);
    if (v < 0) return 0;
    *out = (int64_t)v;
    return 1;
#else
    if (Py_SIZE(o) < 0 || Py_SIZE(o) > 1) return 0;
    *out = (int64_t)PyLong_AsLongLong(o);
    return 1;
#endif
}

static int32_t phase_code(PyObject *phase) {
    if (phase == str_decode) return PHASE_DECODE;
    if (phase == str_prefill) return PHASE_PREFILL;
    if (phase == str_mixed) return PHASE_MIXED;
    if (!PyUnicode_Check(phase)) return -1;
    if (PyUnicode_Compare(phase, str_decode) == 0) return PHASE_DECODE;
    if (PyUnicode_Compare(phase, str_prefill) == 0) return PHASE_PREFILL;
    if (PyUnicode_Compare(phase, str_mixed) == 0) return PHASE_MIXED;
    PyErr_Clear();
    return -1;
}

/* The lens summary of plain values (perfsdk.records.lens_summary); 0 when a value needs Python's checks. */
static int summarise(int32_t code, int64_t batch, int64_t tokens, PyObject *seq_lens, int64_t *sum, int64_t *sq,
                     int64_t *count) {
    *sum = *sq = *count = 0;
    if (seq_lens != Py_None) {
        Py_ssize_t n = PyList_CheckExact(seq_lens) ? PyList_GET_SIZE(seq_lens) : PyTuple_GET_SIZE(seq_lens);
        PyObject **items = PyList_CheckExact(seq_lens) ? ((PyListObject *)seq_lens)->ob_item
                                                       : ((PyTupleObject *)seq_lens)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t v;
            if (!plain_count(items[i], &v)) return 0;
            *sum += v;
            *sq += v * v;
            if (*sq >= LENS_SQ_MAX) return 0;
        }
        *count = n;
        return 1;
    }
    if (code != PHASE_PREFILL || tokens < 0) return 1;
    int64_t b = batch > 1 ? batch : 1;
    int64_t base = tokens / b, extra = tokens % b;
    *sum = tokens;
    *sq = extra * (base + 1) * (base + 1) + (b - extra) * base * base;
    *count = b;
    return 1;
}

static Step *step_make(Hot *hot, PyObject *phase, int32_t code, PyObject *batch, PyObject *tokens,
                       PyObject *context_tokens, PyObject *seq_lens, int64_t nbatch, int64_t ntokens,
                       int64_t ncontext, int64_t sum, int64_t sq, int64_t count) {
    /* a GC type: a user may keep a step where it closes a cycle back to the Monitor */
    Step *s = PyObject_GC_New(Step, &StepType);
    if (!s) return NULL;
    s->hot = (Hot *)Py_NewRef(hot);
    s->phase = Py_NewRef(phase);
    s->batch = Py_NewRef(batch);
    s->tokens = Py_NewRef(tokens);
    s->context_tokens = Py_NewRef(context_tokens);
    s->seq_lens = Py_NewRef(seq_lens);
    s->code = code;
    s->nbatch = nbatch;
    s->ntokens = ntokens;
    s->ncontext = ncontext;
    s->lens_sum = sum;
    s->lens_sq = sq;
    s->lens_count = count;
    s->state = STATE_IDLE;
    s->t0 = 0;
    s->timed = 0;
    s->start = s->end = NO_EVENT;
    s->stream = 0;
    s->outer = NULL;
    s->emitted = s->emitted_more = NULL;
    s->emitted_n = 0;
    PyObject_GC_Track(s);
    return s;
}

/* Let go of this entry's events (an internal error, or a dropped record). */
static void step_let_go(Step *self) {
    if (self->timed == 1) {
        if (self->start != NO_EVENT) core_unref(self->hot->core, self->start);
        if (self->end != NO_EVENT) core_unref(self->hot->core, self->end);
    }
    self->start = self->end = NO_EVENT;
    self->timed = 0;
}

static void step_abandon(Step *self) {
    step_let_go(self);
    self->state = STATE_SKIPPED;
}

static int get_stream(Hot *hot, uintptr_t *out) {
    PyObject *s = PyObject_CallNoArgs(hot->stream);
    if (!s) return -1;
    void *p = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (!p && PyErr_Occurred()) return -1;
    *out = (uintptr_t)p;
    return 0;
}

/* The timed path: take an end event; start from this thread's previous end when the step follows it
   closely, else record a fresh start. */
static int enter_timed(Step *self, Hot *hot, int have_stream) {
    int32_t end = core_acquire(hot->core);
    if (end == -2) return -1;
    if (end == NO_EVENT) {
        hot->event_pool_empty++;  /* every event in flight: counted, not timed */
        self->timed = -1;
        if (now_ns(hot, &self->t0) < 0) return -1;
        return 0;
    }
    self->timed = 1;  /* held from here on: let go of if anything below fails */
    self->end = end;
    if (!have_stream && get_stream(hot, &self->stream) < 0) return -1;
    LastEnd *h = thread_last(hot);
    if (!h) return -1;
    long long now;
    if (now_ns(hot, &now) < 0) {
        Py_DECREF(h);
        return -1;
    }
    self->t0 = now;
    if (h->ev != NO_EVENT && h->seq == hot->last_exit && now - h->t1 < hot->chain_gap_ns &&
        h->stream == self->stream) {
        self->start = h->ev;  /* the thread's hold on it becomes this step's */
        h->ev = NO_EVENT;
        Py_DECREF(h);
        return 0;
    }
    int32_t start = core_acquire(hot->core);
    if (start == -2) {
        Py_DECREF(h);
        return -1;
    }
    if (start == NO_EVENT) {
        core_unref(hot->core, end);  /* never recorded: nobody else knows it */
        self->end = NO_EVENT;
        self->timed = -1;
        hot->event_pool_empty++;
        Py_DECREF(h);
        return 0;
    }
    self->start = start;
    if (h->ev != NO_EVENT) {
        int32_t last = h->ev;
        h->ev = NO_EVENT;
        core_unref(hot->core, last);  /* the thread no longer holds it; the step that ended with it may */
    }
    Py_DECREF(h);
    return record(hot, start, self->stream);
}

static int enter_body(Step *self, Hot *hot) {
    int have_stream = 0;
    if (hot->is_capturing_fn) {
        /* the stream the step's events go on, asked directly (torch's check costs a runtime call more) */
        if (get_stream(hot, &self->stream) < 0) return -1;
        have_stream = 1;
        int status = 0;
        int code = hot->is_capturing_fn((void *)self->stream, &status);
        if (code == CUDA_ERROR_INVALID_CONTEXT && ensure_context(hot) == 0)
            code = hot->is_capturing_fn((void *)self->stream, &status);
        if (code != 0) {
            PyErr_Format(PyExc_RuntimeError, "cuStreamIsCapturing failed (%d)", code);
            return -1;
        }
        if (status != 0) {  /* active, or invalidated: capture time either way */
            self->state = STATE_SKIPPED;
            return 0;
        }
    } else if (hot->capturing) {
        PyObject *r = PyObject_CallNoArgs(hot->capturing);
        if (!r) return -1;
        int cap = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (cap < 0) return -1;
        if (cap) {
            self->state = STATE_SKIPPED;  /* capture time: the work is not really running now */
            return 0;
        }
    }
    if (window_hook(hot, str_step_begin, self->phase) < 0) return -1;
    if (!hot->timed) {
        if (now_ns(hot, &self->t0) < 0) return -1;
    } else if (hot->every > 1 && (++hot->count) % hot->every != 0) {
        self->timed = -1;  /* not sampled (timing_every): counted, not timed */
        if (now_ns(hot, &self->t0) < 0) return -1;
    } else if (enter_timed(self, hot, have_stream) < 0) {
        return -1;
    }
    self->state = STATE_OPEN;
    if (hot->nvtx_on) {  /* last, so that a failure above leaves no range open */
        PyObject *args[2] = {self->phase, self->batch};
        PyObject *r = PyObject_Vectorcall(hot->nvtx_push, args, 2, NULL);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *step_enter(Step *self, PyObject *Py_UNUSED(ignored)) {
    Hot *hot = self->hot;
    if (self->state != STATE_IDLE) {  /* re-entered while open (nested): keep the outer entry */
        if (!self->outer && !(self->outer = PyList_New(0))) return NULL;
        PyObject *saved = Py_BuildValue("(iLiiiK)", self->state, self->t0, self->timed, (int)self->start,
                                        (int)self->end, (unsigned long long)self->stream);
        if (!saved) return NULL;
        int rc = PyList_Append(self->outer, saved);
        Py_DECREF(saved);
        if (rc < 0) return NULL;
        self->timed = 0;  /* the outer entry's events are not this entry's to let go of */
        self->start = self->end = NO_EVENT;
        self->state = STATE_IDLE;
    }
    if (enter_body(self, hot) < 0) {
        if (swallow(hot, self->phase, str_enter_where) < 0) {
            step_abandon(self);
            return NULL;
        }
        step_abandon(self);
    }
    return Py_NewRef(self);
}

/* Exit of an open entry. On failure (-1, exception set) the entry's events have been let go of. */
static int exit_body(Step *self, Hot *hot, long long t0, int timed, int32_t start, int32_t end, uintptr_t stream,
                     PyObject *exc_type, long long *exit_t) {
    /* A timed step reads the clock after its end record, not before: a record that waited for room in a full
       launch queue (graphs replayed back to back) still sits right behind the step's work, and the chain gap
       to the next step must count from its return. */
    long long t1 = 0;
    if (timed != 1 && now_ns(hot, &t1) < 0) return -1;
    if (timed != 1) *exit_t = t1;
    StepRecord r;
    r.phase = self->code;
    r.timing = hot->timed ? TIMING_UNTIMED : TIMING_HOST;
    r.start = r.end = NO_EVENT;
    if (timed == 1) {
        long long before = hot->exit_seq;
        if (record(hot, end, stream) < 0) {
            if (start != NO_EVENT) core_unref(hot->core, start);
            core_unref(hot->core, end);
            return -1;
        }
        if (now_ns(hot, &t1) < 0) {  /* recorded, but the step cannot be counted: nobody reads the events */
            if (start != NO_EVENT) core_unref(hot->core, start);
            core_unref(hot->core, end);
            return -1;
        }
        *exit_t = t1;
        LastEnd *h = thread_last(hot);
        if (!h) {  /* recorded, but no thread holds it: the step's holds go with the record below */
            if (start != NO_EVENT) core_unref(hot->core, start);
            core_unref(hot->core, end);
            return -1;
        }
        int32_t inner = h->ev;  /* a nested step's end on this thread: the thread lets go of it */
        core_hold(hot->core, end);  /* the thread holds it too: a possible next start */
        h->ev = end;
        h->stream = stream;
        h->t1 = t1;
        long long seq = ++hot->exit_seq;
        /* another thread's step exited while the record ran: its GPU work may sit after this end event on
           the stream, so the next step must not start from it (cannot happen with a record that keeps the
           GIL, as this one does; kept for the algorithm's sake) */
        h->seq = seq == before + 1 ? seq : -1;
        hot->last_exit = seq;
        Py_DECREF(h);
        if (inner != NO_EVENT) core_unref(hot->core, inner);
        r.timing = TIMING_TIMED;
        r.start = start;
        r.end = end;
    } else if (timed == -1) {
        hot->exit_seq++;     /* every exit is numbered: a timed step's exit can tell that one came between */
        hot->last_exit = 0;  /* an untimed step: the next timed one must not start before it */
    }
    r.error = 0;
    if (exc_type != Py_None) {
        PyObject *name = PyObject_GetAttr(exc_type, str_qualname);
        if (name) {
            int e = PyUnicode_Check(name) ? core_error_name(hot->core, name) : 1;
            Py_DECREF(name);
            r.error = e > 0 ? e : 1;
            if (e < 0) PyErr_Clear();
        } else {
            PyErr_Clear();
            r.error = 1;
        }
    }
    r.t0 = t0;
    r.t1 = t1;
    r.batch = self->nbatch;
    r.tokens = self->ntokens;
    r.context_tokens = self->ncontext;
    r.lens_sum = self->lens_sum;
    r.lens_sq = self->lens_sq;
    r.lens_count = self->lens_count;
    if (!core_push(hot->core, &r) && r.timing == TIMING_TIMED) {  /* dropped: the step's holds end here */
        if (start != NO_EVENT) core_unref(hot->core, start);
        core_unref(hot->core, end);
    }
    return window_hook(hot, str_step_end, self->phase);
}

/* One perfsdk.records.Tokens(requests, t, n) on the request queue: a tuple subclass made here (no Python frame),
   then its push(). 0, or -1 with an exception set. */
static int push_tokens(Hot *hot, PyObject *requests, int64_t n, long long t) {
    PyObject *tobj = PyLong_FromLongLong(t), *nobj = tobj ? PyLong_FromLongLong(n) : NULL;
    PyObject *ev = nobj ? hot->tokens_type->tp_alloc(hot->tokens_type, 3) : NULL;
    if (!ev) {
        Py_XDECREF(tobj);
        Py_XDECREF(nobj);
        return -1;
    }
    PyTuple_SET_ITEM(ev, 0, Py_NewRef(requests));
    PyTuple_SET_ITEM(ev, 1, tobj);
    PyTuple_SET_ITEM(ev, 2, nobj);
    PyObject *r = PyObject_CallOneArg(hot->requests_push, ev);
    Py_DECREF(ev);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* At exit: the tokens step.tokens() was told of, stamped t (negative: a clock read now). */
static int emit_tokens(Step *self, Hot *hot, long long t) {
    PyObject *requests = self->emitted, *more = self->emitted_more;
    int64_t n = self->emitted_n;
    self->emitted = self->emitted_more = NULL;
    int rc = t < 0 ? now_ns(hot, &t) : 0;
    if (rc == 0) rc = push_tokens(hot, requests, n, t);
    for (Py_ssize_t i = 0; rc == 0 && more && i < PyList_GET_SIZE(more); i++) {
        PyObject *item = PyList_GET_ITEM(more, i);  /* (requests, n) */
        rc = push_tokens(hot, PyTuple_GET_ITEM(item, 0), PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1)), t);
    }
    Py_DECREF(requests);
    Py_XDECREF(more);
    return rc;
}

/* step.tokens(requests, n=1): this step emitted n tokens for each of requests (perfsdk.hotpath.Step.tokens).
   A list or tuple and a plain n are taken as they are (a copy of the list: its length is the only cost that
   grows with the batch); anything else, and everything in strict mode, goes through the queue's checks. */
static PyObject *step_tokens(Step *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Hot *hot = self->hot;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs < 1 || nargs + nkw > 2 || (nkw && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), str_n) != 0)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "tokens(requests, n=1)");
        return NULL;
    }
    if (!hot->requests_push) Py_RETURN_NONE;
    PyObject *given = args[0], *nobj = nargs + nkw == 2 ? args[1] : NULL;
    PyObject *requests;
    int64_t n = 1;
    if (!hot->strict && (PyList_CheckExact(given) || PyTuple_CheckExact(given)) && (!nobj || plain_count(nobj, &n))) {
        requests = PySequence_Tuple(given);  /* a tuple: itself */
        if (!requests) return swallow(hot, str_step, str_tokens_where) < 0 ? NULL : Py_NewRef(Py_None);
    } else {
        PyObject *one = NULL;
        if (!nobj) nobj = one = PyLong_FromLong(1);
        PyObject *checked = nobj ? PyObject_CallFunctionObjArgs(hot->token_args, str_step_tokens, given, nobj, NULL)
                                 : NULL;
        Py_XDECREF(one);
        if (!checked) {  /* strict: the ConfigError is the caller's; else a failure of perfsdk's own, counted */
            if (hot->strict) return NULL;
            return swallow(hot, str_step, str_tokens_where) < 0 ? NULL : Py_NewRef(Py_None);
        }
        if (checked == Py_None) {  /* refused, counted */
            Py_DECREF(checked);
            Py_RETURN_NONE;
        }
        requests = Py_NewRef(PyTuple_GET_ITEM(checked, 0));
        n = PyLong_AsLongLong(PyTuple_GET_ITEM(checked, 1));
        Py_DECREF(checked);
    }
    if (n == 0 || PyTuple_GET_SIZE(requests) == 0) {
        Py_DECREF(requests);
        Py_RETURN_NONE;
    }
    int rc = 0;
    if (self->state == STATE_IDLE) {  /* not inside the step: now */
        long long t;
        rc = now_ns(hot, &t) < 0 ? -1 : push_tokens(hot, requests, n, t);
        Py_DECREF(requests);
    } else if (!self->emitted) {
        self->emitted = requests;  /* the reference is the step's */
        self->emitted_n = n;
    } else {
        PyObject *item = Py_BuildValue("(NL)", requests, (long long)n);
        if (!item || (!self->emitted_more && !(self->emitted_more = PyList_New(0))) ||
            PyList_Append(self->emitted_more, item) < 0)
            rc = -1;
        Py_XDECREF(item);
    }
    if (rc < 0 && swallow(hot, str_step, str_tokens_where) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *step_exit(Step *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes exactly 3 arguments");
        return NULL;
    }
    Hot *hot = self->hot;
    int state = self->state, timed = self->timed;
    long long t0 = self->t0;
    int32_t start = self->start, end = self->end;
    uintptr_t stream = self->stream;
    self->state = STATE_IDLE;
    self->timed = 0;
    self->start = self->end = NO_EVENT;
    if (self->outer && PyList_GET_SIZE(self->outer) > 0) {
        Py_ssize_t n = PyList_GET_SIZE(self->outer);
        PyObject *saved = PyList_GET_ITEM(self->outer, n - 1);
        int st, tm, a, b;
        long long t;
        unsigned long long s;
        if (PyArg_ParseTuple(saved, "iLiiiK", &st, &t, &tm, &a, &b, &s)) {
            self->state = st;
            self->t0 = t;
            self->timed = tm;
            self->start = a;
            self->end = b;
            self->stream = (uintptr_t)s;
        } else {
            PyErr_Clear();
        }
        PyList_SetSlice(self->outer, n - 1, n, NULL);
    }
    long long exit_t = -1;  /* the exit's clock read, once made */
    if (state == STATE_OPEN) {
        if (hot->nvtx_on) {  /* first: the range closes even if what follows fails */
            PyObject *r = PyObject_CallNoArgs(hot->nvtx_pop);
            if (r) Py_DECREF(r);
            else if (swallow(hot, self->phase, str_nvtx_where) < 0) {  /* the step is still timed */
                if (timed == 1) {
                    if (start != NO_EVENT) core_unref(hot->core, start);
                    core_unref(hot->core, end);
                }
                return NULL;
            }
        }
        if (exit_body(self, hot, t0, timed, start, end, stream, args[0], &exit_t) < 0 &&
            swallow(hot, self->phase, str_exit_where) < 0)
            return NULL;
    }
    /* not timed (capture time, an internal error) or not: the tokens told of are the requests' */
    if (self->emitted && emit_tokens(self, hot, exit_t) < 0 && swallow(hot, self->phase, str_tokens_where) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *step_call(Step *self, PyObject *args, PyObject *kw) {
    PyObject *fn;
    if ((kw && PyDict_GET_SIZE(kw)) || !PyArg_ParseTuple(args, "O:decorator", &fn)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a step decorator takes one function");
        return NULL;
    }
    return PyObject_CallFunctionObjArgs(self->hot->decorate, (PyObject *)self, fn, NULL);
}

static PyObject *step_sizes(Step *self, void *Py_UNUSED(closure)) {
    return PyTuple_Pack(4, self->batch, self->tokens, self->context_tokens, self->seq_lens);
}

static PyObject *step_phase(Step *self, void *Py_UNUSED(closure)) { return Py_NewRef(self->phase); }

static PyObject *step_repr(Step *self) {
    return PyUnicode_FromFormat("<perfsdk step %U batch=%R>", self->phase, self->batch);
}

static PyMethodDef step_methods[] = {
    {"__enter__", (PyCFunction)step_enter, METH_NOARGS, "Start the step."},
    {"__exit__", (PyCFunction)(void (*)(void))step_exit, METH_FASTCALL, "End the step."},
    {"tokens", (PyCFunction)(void (*)(void))step_tokens, METH_FASTCALL | METH_KEYWORDS,
     "tokens(requests, n=1): this step emitted n tokens for each of requests (recorded with its exit)."},
    {NULL}};

static PyGetSetDef step_getset[] = {
    {"phase", (getter)step_phase, NULL, "prefill, decode or mixed", NULL},
    {"sizes", (getter)step_sizes, NULL, "(batch, tokens, context_tokens, seq_lens)", NULL},
    {NULL}};

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "perfsdk._native.Step",
    .tp_doc = "One prefill, decode or mixed step (perfsdk.hotpath.Step's algorithm, in C): a context manager and "
              "a decorator. Made by Monitor.prefill/decode/mixed.",
    .tp_basicsize = sizeof(Step),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)step_dealloc,
    .tp_traverse = (traverseproc)step_traverse,
    .tp_clear = (inquiry)step_clear,
    .tp_call = (ternaryfunc)step_call,
    .tp_repr = (reprfunc)step_repr,
    .tp_methods = step_methods,
    .tp_getset = step_getset,
};

/* hot.step(phase, batch, tokens, context_tokens, seq_lens): a Step; odd sizes go through Python's validation. */
static PyObject *hot_step(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "step(phase, batch, tokens, context_tokens, seq_lens)");
        return NULL;
    }
    PyObject *batch = args[1], *tokens = args[2], *context_tokens = args[3], *seq_lens = args[4];
    int32_t code = PyUnicode_CheckExact(args[0]) ? phase_code(args[0]) : -1;
    int64_t b, t = NO_TOKENS, c, sum, sq, count;
    if (code >= 0 && plain_count(batch, &b) && (tokens == Py_None || plain_count(tokens, &t)) &&
        plain_count(context_tokens, &c) && (seq_lens == Py_None || PyTuple_CheckExact(seq_lens) || PyList_CheckExact(seq_lens)) &&
        summarise(code, b, t, seq_lens, &sum, &sq, &count))
        return (PyObject *)step_make(self, args[0], code, batch, tokens, context_tokens, seq_lens, b, t, c, sum, sq, count);
    return PyObject_Vectorcall(self->slow_step, args, 5, NULL);
}

static PyMethodDef hot_methods[] = {
    {"step", (PyCFunction)(void (*)(void))hot_step, METH_FASTCALL,
     "step(phase, batch, tokens, context_tokens, seq_lens) -> a step context manager"},
    {NULL}};

static PyMemberDef hot_members[] = {
    {"window", T_OBJECT, offsetof(Hot, window), 0, "the profiler window, None: none (Recorder.set_window sets it)"},
    {"last_exit", T_LONGLONG, offsetof(Hot, last_exit), READONLY, "exit number of the latest timed step"},
    {"event_pool_empty", T_LONGLONG, offsetof(Hot, event_pool_empty), READONLY,
     "steps counted but not timed because every event was in flight"},
    {NULL}};

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "perfsdk._native.Hot",
    .tp_doc = "One Monitor's hot path, bound from a perfsdk.hotpath.HotState.",
    .tp_basicsize = sizeof(Hot),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = hot_new,
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_methods = hot_methods,
    .tp_members = hot_members,
};

/* make_step(hot, phase, batch, tokens, context_tokens, seq_lens): a Step from sizes Python has validated. */
static PyObject *make_step(PyObject *module, PyObject *args) {
    PyObject *hot, *phase, *batch, *tokens, *context_tokens, *seq_lens;
    if (!PyArg_ParseTuple(args, "O!UOOOO:make_step", &HotType, &hot, &phase, &batch, &tokens, &context_tokens,
                          &seq_lens))
        return NULL;
    int32_t code = phase_code(phase);
    if (code < 0) {
        PyErr_Format(PyExc_ValueError, "make_step: unknown phase %R", phase);
        return NULL;
    }
    long long b = PyLong_AsLongLong(batch), c = PyLong_AsLongLong(context_tokens);
    long long t = tokens == Py_None ? NO_TOKENS : PyLong_AsLongLong(tokens);
    if (PyErr_Occurred()) return NULL;
    int64_t sum = 0, sq = 0, count = 0;
    if (seq_lens != Py_None) {
        PyObject *fast = PySequence_Fast(seq_lens, "seq_lens must be a sequence");
        if (!fast) return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(fast);
                return NULL;
            }
            sum += v;
            sq += v * v;
        }
        count = n;
        Py_DECREF(fast);
    } else if (!summarise(code, b, t, Py_None, &sum, &sq, &count)) {
        PyErr_SetString(PyExc_ValueError, "make_step: sizes out of range");
        return NULL;
    }
    return (PyObject *)step_make((Hot *)hot, phase, code, batch, tokens, context_tokens, seq_lens, b, t, c, sum, sq,
                                 count);
}

static PyMethodDef hotpath_functions[] = {
    {"make_step", (PyCFunction)make_step, METH_VARARGS,
     "make_step(hot, phase, batch, tokens, context_tokens, seq_lens): a Step from validated sizes"},
    {NULL}};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1

int init_hotpath(PyObject *module) {
    INTERN(str_wants_steps, "wants_steps");
    INTERN(str_step_begin, "step_begin");
    INTERN(str_step_end, "step_end");
    INTERN(str_h, "h");
    INTERN(str_qualname, "__qualname__");
    INTERN(str_prefill, "prefill");
    INTERN(str_decode, "decode");
    INTERN(str_mixed, "mixed");
    INTERN(str_enter_where, ".__enter__");
    INTERN(str_exit_where, ".__exit__");
    INTERN(str_nvtx_where, ".__exit__ nvtx");
    INTERN(str_n, "n");
    INTERN(str_step, "step");
    INTERN(str_step_tokens, "step.tokens");
    INTERN(str_tokens_where, ".tokens");
    if (PyType_Ready(&LastEndType) < 0 || PyType_Ready(&StepType) < 0 || PyType_Ready(&HotType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "LastEnd", (PyObject *)&LastEndType) < 0 ||
        PyModule_AddObjectRef(module, "Step", (PyObject *)&StepType) < 0 ||
        PyModule_AddObjectRef(module, "Hot", (PyObject *)&HotType) < 0)
        return -1;
    return PyModule_AddFunctions(module, hotpath_functions);
}
