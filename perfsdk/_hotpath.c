/* perfsdk._hotpath: the step wrappers' enter and exit in C.
 *
 * What `with mon.decode(...)` runs on the serving thread, every step, is the
 * same algorithm as perfsdk/monitor.py's Phase.__enter__/__exit__ (read that
 * first: it is the specification, and tests/test_cuda_steps.py runs against
 * both): a clock read, a pooled CUDA event recorded on the current stream
 * (or the previous step's end event reused as this step's start), an NVTX
 * push/pop when on, and one tuple appended to the collector's queue. Done in
 * C it costs a fraction of the Python: no frame, no bytecode, no attribute
 * lookups by name, and the driver's cuEventRecord called straight through its
 * function pointer instead of through ctypes.
 *
 * Everything that is not the steady path calls back into Python: validation
 * of odd sizes, the decorator, the profiler window's hooks, error recording,
 * orphaned events. Nothing here releases the GIL itself, so the counters below
 * need no lock; with driver events nothing between a step's end record and its
 * exit number runs Python either. A Python record (torch's events release the
 * GIL) can let another thread step in between: the exit numbers detect that,
 * and the next step then records a fresh start instead of chaining.
 *
 * Types:
 *   Hot      one per Monitor: the callables and counters the hot path uses,
 *            bound once (Monitor._bind_hot); hot.step(...) makes a Step.
 *   Step     one `with`: __enter__, __exit__, __call__ (decorator).
 *   LastEnd  one per serving thread (in a threading.local): the thread's last
 *            timed step's end event, which the next step may start from.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#define STATE_IDLE 0
#define STATE_OPEN 1
#define STATE_SKIPPED 2

typedef int (*record_fn_t)(void *event, void *stream);
typedef int (*is_capturing_fn_t)(void *stream, int *status);  /* cuStreamIsCapturing */
#define CUDA_ERROR_INVALID_CONTEXT 201  /* no current context on this thread (a new thread's first CUDA call) */

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

static PyObject *str_hot, *str_step_begin, *str_step_end, *str_h, *str_qualname;
static PyObject *str_enter_where, *str_exit_where, *str_nvtx_where, *str_step_tag, *empty_tuple;
static PyTypeObject LastEndType, StepType, HotType;

/* ------------------------------------------------------------------ LastEnd */

/* Take the thread's held end event (a new reference), or NULL; None set from Python means none too. */
#define LASTEND_TAKE(h, out) do { (out) = (h)->ev; (h)->ev = NULL; \
    if ((out) == Py_None) { Py_DECREF(out); (out) = NULL; } } while (0)

typedef struct {
    PyObject_HEAD
    PyObject *ev;      /* the end event of this thread's last timed step, or NULL */
    PyObject *stream;  /* its stream */
    long long t1;      /* its host exit time */
    long long seq;     /* its exit number (Hot.exit_seq) */
    PyObject *orphan;  /* Monitor._orphan: where ev goes when the thread ends */
} LastEnd;

static PyObject *lastend_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *orphan;
    if (!PyArg_ParseTuple(args, "O:LastEnd", &orphan)) return NULL;
    LastEnd *self = PyObject_GC_New(LastEnd, type);
    if (!self) return NULL;
    self->ev = NULL;
    self->stream = NULL;
    self->t1 = 0;
    self->seq = -1;
    self->orphan = Py_NewRef(orphan);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int lastend_traverse(LastEnd *self, visitproc visit, void *arg) {
    Py_VISIT(self->ev);
    Py_VISIT(self->stream);
    Py_VISIT(self->orphan);
    return 0;
}

static int lastend_clear(LastEnd *self) {
    Py_CLEAR(self->ev);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->orphan);
    return 0;
}

static void lastend_dealloc(LastEnd *self) {
    PyObject_GC_UnTrack(self);
    /* the thread ended (its threading.local went): the Monitor gives the event back once the
       collector has read past the step that ended with it */
    if (self->ev && self->ev != Py_None && self->orphan) {
        saved_exc saved = exc_save();
        PyObject *r = PyObject_CallOneArg(self->orphan, self->ev);
        if (r) Py_DECREF(r); else PyErr_Clear();
        exc_restore(saved);
    }
    lastend_clear(self);
    PyObject_GC_Del(self);
}

static PyMemberDef lastend_members[] = {
    {"ev", T_OBJECT, offsetof(LastEnd, ev), 0, "the thread's last timed step's end event (None: none held)"},
    {"stream", T_OBJECT, offsetof(LastEnd, stream), 0, "its stream"},
    {"t1", T_LONGLONG, offsetof(LastEnd, t1), 0, "its host exit time (ns)"},
    {"seq", T_LONGLONG, offsetof(LastEnd, seq), 0, "its exit number"},
    {NULL}
};

static PyTypeObject LastEndType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "perfsdk._hotpath.LastEnd",
    .tp_doc = "One serving thread's last timed step: its end event, stream, exit time and exit number.",
    .tp_basicsize = sizeof(LastEnd),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = lastend_new,
    .tp_dealloc = (destructor)lastend_dealloc,
    .tp_traverse = (traverseproc)lastend_traverse,
    .tp_clear = (inquiry)lastend_clear,
    .tp_members = lastend_members,
};

/* ---------------------------------------------------------------------- Hot */

typedef struct {
    PyObject_HEAD
    PyObject *mon;           /* the Monitor (its _window is read live: enable_profiler swaps it) */
    PyObject *clock;         /* () -> int ns; NULL: CLOCK_MONOTONIC, which is time.perf_counter_ns on Linux */
    PyObject *capturing;     /* () -> bool, or NULL: no capture check (or is_capturing_fn) */
    is_capturing_fn_t is_capturing_fn;  /* cuStreamIsCapturing itself, asked about the step's stream */
    PyObject *window;        /* the Monitor's profiler window or None (the Monitor sets it when it changes) */
    PyObject *stream;        /* () -> the current stream's handle */
    PyObject *record_on;     /* (event, stream) -> result (truthy: an error code); NULL when record_fn */
    record_fn_t record_fn;   /* cuEventRecord itself (events and streams are ints holding the handles) */
    PyObject *raise_for;     /* (code) -> raises */
    PyObject *pool_pop;      /* () -> event (raises IndexError when empty), or NULL: host timing */
    PyObject *pool_acquire;  /* () -> event or None */
    PyObject *pool_release;  /* (event) -> None */
    PyObject *queue;         /* the collector's deque */
    PyObject *queue_append;
    Py_ssize_t queue_cap;
    PyObject *local;         /* threading.local whose .h is this thread's LastEnd */
    int nvtx_on;
    PyObject *nvtx_push;     /* (phase, batch) */
    PyObject *nvtx_pop;      /* () */
    PyObject *errors_record; /* (exc, where) */
    PyObject *orphan;        /* (*events) */
    PyObject *give_back;     /* ((start, end, others)) */
    PyObject *decorate;      /* (step, fn) -> wrapped fn */
    PyObject *slow_step;     /* (phase, batch, tokens, ctx, seq_lens) -> a Step or a Python Phase */
    PyObject *ensure_context; /* () -> None: make the events' context current on this thread, or NULL */
    long long chain_gap_ns;
    long long every;         /* time every N-th step */
    long long count;         /* steps entered (for every) */
    long long last_exit;     /* exit number of the latest timed step (0: an untimed step came after it) */
    long long exit_seq;
    long long dropped;       /* steps dropped because the queue was full */
    long long untimed;       /* steps counted but not timed: every event in flight */
} Hot;

static int hot_traverse(Hot *self, visitproc visit, void *arg) {
    Py_VISIT(self->mon);
    Py_VISIT(self->clock);
    Py_VISIT(self->capturing);
    Py_VISIT(self->window);
    Py_VISIT(self->stream);
    Py_VISIT(self->record_on);
    Py_VISIT(self->raise_for);
    Py_VISIT(self->pool_pop);
    Py_VISIT(self->pool_acquire);
    Py_VISIT(self->pool_release);
    Py_VISIT(self->queue);
    Py_VISIT(self->queue_append);
    Py_VISIT(self->local);
    Py_VISIT(self->nvtx_push);
    Py_VISIT(self->nvtx_pop);
    Py_VISIT(self->errors_record);
    Py_VISIT(self->orphan);
    Py_VISIT(self->give_back);
    Py_VISIT(self->decorate);
    Py_VISIT(self->slow_step);
    Py_VISIT(self->ensure_context);
    return 0;
}

static int hot_clear(Hot *self) {
    Py_CLEAR(self->mon);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->capturing);
    Py_CLEAR(self->window);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->record_on);
    Py_CLEAR(self->raise_for);
    Py_CLEAR(self->pool_pop);
    Py_CLEAR(self->pool_acquire);
    Py_CLEAR(self->pool_release);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->queue_append);
    Py_CLEAR(self->local);
    Py_CLEAR(self->nvtx_push);
    Py_CLEAR(self->nvtx_pop);
    Py_CLEAR(self->errors_record);
    Py_CLEAR(self->orphan);
    Py_CLEAR(self->give_back);
    Py_CLEAR(self->decorate);
    Py_CLEAR(self->slow_step);
    Py_CLEAR(self->ensure_context);
    return 0;
}

static void hot_dealloc(Hot *self) {
    PyObject_GC_UnTrack(self);
    hot_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *opt(PyObject *o) { return (o == NULL || o == Py_None) ? NULL : Py_NewRef(o); }

static PyObject *hot_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {
        "mon", "clock", "capturing", "is_capturing_fn", "stream", "record_on", "record_fn", "raise_for", "pool_pop",
        "pool_acquire", "pool_release", "queue", "queue_cap", "local", "nvtx_on", "nvtx_push", "nvtx_pop",
        "errors_record", "orphan", "give_back", "decorate", "slow_step", "chain_gap_ns", "every", "ensure_context",
        NULL};
    PyObject *mon, *clock, *capturing, *stream, *record_on, *raise_for, *pool_pop, *pool_acquire, *pool_release;
    PyObject *queue, *local, *nvtx_push, *nvtx_pop, *errors_record, *orphan, *give_back, *decorate, *slow_step;
    PyObject *ensure_context = NULL;
    unsigned long long record_fn, is_capturing_fn;
    Py_ssize_t queue_cap;
    int nvtx_on;
    long long chain_gap_ns, every;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "OOOKOOKOOOOOnOpOOOOOOOLL|O:Hot", kwlist, &mon, &clock, &capturing, &is_capturing_fn, &stream, &record_on,
            &record_fn, &raise_for, &pool_pop, &pool_acquire, &pool_release, &queue, &queue_cap, &local,
            &nvtx_on, &nvtx_push, &nvtx_pop, &errors_record, &orphan, &give_back, &decorate, &slow_step,
            &chain_gap_ns, &every, &ensure_context))
        return NULL;
    if (every < 1) {
        PyErr_SetString(PyExc_ValueError, "every must be >= 1");
        return NULL;
    }
    PyObject *append = PyObject_GetAttrString(queue, "append");
    if (!append) return NULL;
    Hot *self = PyObject_GC_New(Hot, type);
    if (!self) {
        Py_DECREF(append);
        return NULL;
    }
    self->mon = Py_NewRef(mon);
    self->clock = opt(clock);
    self->capturing = opt(capturing);
    self->is_capturing_fn = (is_capturing_fn_t)(uintptr_t)is_capturing_fn;
    self->window = Py_NewRef(Py_None);
    self->stream = Py_NewRef(stream);
    self->record_on = record_fn ? NULL : opt(record_on);
    self->record_fn = (record_fn_t)(uintptr_t)record_fn;
    self->raise_for = Py_NewRef(raise_for);
    self->pool_pop = opt(pool_pop);
    self->pool_acquire = opt(pool_acquire);
    self->pool_release = opt(pool_release);
    self->queue = Py_NewRef(queue);
    self->queue_append = append;
    self->queue_cap = queue_cap;
    self->local = Py_NewRef(local);
    self->nvtx_on = nvtx_on;
    self->nvtx_push = Py_NewRef(nvtx_push);
    self->nvtx_pop = Py_NewRef(nvtx_pop);
    self->errors_record = Py_NewRef(errors_record);
    self->orphan = Py_NewRef(orphan);
    self->give_back = Py_NewRef(give_back);
    self->decorate = Py_NewRef(decorate);
    self->slow_step = Py_NewRef(slow_step);
    self->ensure_context = opt(ensure_context);
    self->chain_gap_ns = chain_gap_ns;
    self->every = every;
    self->count = 0;
    self->last_exit = 0;
    self->exit_seq = 0;
    self->dropped = 0;
    self->untimed = 0;
    PyObject_GC_Track(self);
    if (self->pool_pop && (!self->pool_acquire || !self->pool_release || (!self->record_on && !self->record_fn))) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_ValueError, "CUDA timing needs pool_acquire, pool_release and a record");
        return NULL;
    }
    return (PyObject *)self;
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

/* Record event on stream. 0, or -1 with an exception set (the driver's code goes through raise_for). */
static int record(Hot *hot, PyObject *event, PyObject *stream) {
    if (hot->record_fn) {
        void *e = PyLong_AsVoidPtr(event);
        if (!e && PyErr_Occurred()) return -1;
        void *s = PyLong_AsVoidPtr(stream);
        if (!s && PyErr_Occurred()) return -1;
        int code = hot->record_fn(e, s);
        if (code == CUDA_ERROR_INVALID_CONTEXT && ensure_context(hot) == 0) code = hot->record_fn(e, s);
        if (code == 0) return 0;
        PyObject *c = PyLong_FromLong(code);
        if (!c) return -1;
        PyObject *r = PyObject_CallOneArg(hot->raise_for, c);
        Py_DECREF(c);
        Py_XDECREF(r);
        if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "cuEventRecord failed (%d)", code);
        return -1;
    }
    PyObject *args[2] = {event, stream};
    PyObject *r = PyObject_Vectorcall(hot->record_on, args, 2, NULL);
    if (!r) return -1;
    if (PyLong_CheckExact(r) && PyLong_AsLong(r) == CUDA_ERROR_INVALID_CONTEXT && ensure_context(hot) == 0) {
        Py_DECREF(r);
        if (!(r = PyObject_Vectorcall(hot->record_on, args, 2, NULL))) return -1;
    }
    int bad = PyObject_IsTrue(r);
    if (bad > 0) {
        PyObject *r2 = PyObject_CallOneArg(hot->raise_for, r);
        Py_DECREF(r);
        Py_XDECREF(r2);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "CUDA event record failed");
        return -1;
    }
    Py_DECREF(r);
    return bad;  /* 0, or -1 if truth testing failed */
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
        PyErr_SetString(PyExc_TypeError, "perfsdk: the thread's step state is not a _hotpath.LastEnd");
        return NULL;
    }
    return (LastEnd *)h;
}

/* The profiler window's hook, when a window is set and hot. */
static int window_hook(Hot *hot, PyObject *name, PyObject *phase) {
    PyObject *w = hot->window;
    if (w == NULL || w == Py_None) return 0;
    Py_INCREF(w);
    PyObject *flag = PyObject_GetAttr(w, str_hot);
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

/* --------------------------------------------------------------------- Step */

typedef struct {
    PyObject_HEAD
    Hot *hot;
    PyObject *phase, *batch, *tokens, *ctx, *seq_lens;
    int state;
    long long t0;
    PyObject *ev;      /* NULL: no events; Py_False: not timed; a tuple (start, end, others) */
    PyObject *stream;  /* the stream the end is recorded on */
    PyObject *outer;   /* a list of (state, t0, ev, stream) of enclosing entries when re-entered, or NULL */
} Step;

static int step_traverse(Step *self, visitproc visit, void *arg) {
    Py_VISIT(self->hot);
    Py_VISIT(self->batch);
    Py_VISIT(self->tokens);
    Py_VISIT(self->ctx);
    Py_VISIT(self->seq_lens);
    Py_VISIT(self->ev);
    Py_VISIT(self->stream);
    Py_VISIT(self->outer);
    return 0;
}

static int step_clear(Step *self) {
    Py_CLEAR(self->hot);
    Py_CLEAR(self->phase);
    Py_CLEAR(self->batch);
    Py_CLEAR(self->tokens);
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->seq_lens);
    Py_CLEAR(self->ev);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->outer);
    return 0;
}

static void step_dealloc(Step *self) {
    PyObject_GC_UnTrack(self);
    step_clear(self);
    PyObject_GC_Del(self);
}

static Step *step_make(Hot *hot, PyObject *phase, PyObject *batch, PyObject *tokens, PyObject *ctx,
                       PyObject *seq_lens) {
    /* a GC type: a user may keep a step where it closes a cycle back to the Monitor */
    Step *s = PyObject_GC_New(Step, &StepType);
    if (!s) return NULL;
    s->hot = (Hot *)Py_NewRef(hot);
    s->phase = Py_NewRef(phase);
    s->batch = Py_NewRef(batch);
    s->tokens = Py_NewRef(tokens);
    s->ctx = Py_NewRef(ctx);
    s->seq_lens = Py_NewRef(seq_lens);
    s->state = STATE_IDLE;
    s->t0 = 0;
    s->ev = NULL;
    s->stream = NULL;
    s->outer = NULL;
    PyObject_GC_Track(s);
    return s;
}

static inline int plain_count(PyObject *o) {
    /* an exact, non-negative, machine-sized int: what nearly every caller passes (the rest is validated
       in Python) */
    if (!PyLong_CheckExact(o)) return 0;
#if PY_VERSION_HEX >= 0x030C0000
    return PyUnstable_Long_IsCompact((PyLongObject *)o) && PyUnstable_Long_CompactValue((PyLongObject *)o) >= 0;
#else
    return Py_SIZE(o) >= 0 && Py_SIZE(o) <= 1;
#endif
}

/* Give back this entry's events after an internal error and record nothing for it. */
static void step_abandon(Step *self) {
    PyObject *ev = self->ev;
    self->ev = NULL;
    self->state = STATE_SKIPPED;
    if (ev && PyTuple_Check(ev)) {
        PyObject *r = PyObject_CallOneArg(self->hot->give_back, ev);
        if (r) Py_DECREF(r); else PyErr_Clear();
    }
    Py_XDECREF(ev);
}

/* Hand a failed exit's events to Monitor._give_back, keeping the exception that is being raised. */
static void give_back_keeping_error(Hot *hot, PyObject *ev) {
    saved_exc saved = exc_save();
    PyObject *r = PyObject_CallOneArg(hot->give_back, ev);
    Py_XDECREF(r);
    PyErr_Clear();
    exc_restore(saved);
}

static int set_ev(Step *self, PyObject *a, PyObject *b, PyObject *c) {
    PyObject *t = PyTuple_Pack(3, a, b, c);
    if (!t) return -1;
    Py_XSETREF(self->ev, t);
    return 0;
}

/* Record a fresh start event (the step does not follow the previous one closely). */
static int start_fresh(Step *self, Hot *hot, PyObject *end, PyObject *stream, LastEnd *h) {
    PyObject *start = PyObject_CallNoArgs(hot->pool_acquire);
    if (!start) return -1;
    if (start == Py_None) {
        Py_DECREF(start);
        Py_XSETREF(self->ev, Py_NewRef(Py_False));
        hot->untimed++;
        PyObject *r = PyObject_CallOneArg(hot->pool_release, end);  /* never recorded: nobody else knows it */
        if (!r) return -1;
        Py_DECREF(r);
        return 0;
    }
    int rc;
    PyObject *last;
    LASTEND_TAKE(h, last);
    if (last) {
        PyObject *others = PyTuple_Pack(1, last);
        Py_DECREF(last);
        rc = others ? set_ev(self, start, end, others) : -1;
        Py_XDECREF(others);
    } else {
        rc = set_ev(self, start, end, empty_tuple);
    }
    Py_DECREF(start);
    if (rc < 0) return -1;
    return record(hot, PyTuple_GET_ITEM(self->ev, 0), stream);
}

/* The timed path: take an end event; start from this thread's previous end when the step follows it
   closely, else record a fresh start. */
static int enter_timed(Step *self, Hot *hot) {
    PyObject *end = PyObject_CallNoArgs(hot->pool_pop);
    if (!end) {
        if (!PyErr_ExceptionMatches(PyExc_IndexError)) return -1;
        PyErr_Clear();
        end = PyObject_CallNoArgs(hot->pool_acquire);
        if (!end) return -1;
    }
    if (end == Py_None) {
        Py_DECREF(end);
        hot->untimed++;  /* every event in flight: counted, not timed */
        Py_XSETREF(self->ev, Py_NewRef(Py_False));
        if (now_ns(hot, &self->t0) < 0) return -1;
        self->state = STATE_OPEN;
        return 0;
    }
    int rc = set_ev(self, Py_None, end, empty_tuple);  /* owned from here on: given back if anything fails */
    if (rc < 0) {
        PyObject *r = PyObject_CallOneArg(hot->pool_release, end);
        Py_XDECREF(r);
        Py_DECREF(end);
        return -1;
    }
    PyObject *stream = self->stream;  /* fetched already by the capture check, or now */
    if (!stream) {
        if (!(stream = PyObject_CallNoArgs(hot->stream))) {
            Py_DECREF(end);
            return -1;
        }
        self->stream = stream;
    }
    LastEnd *h = thread_last(hot);
    if (!h) {
        Py_DECREF(end);
        return -1;
    }
    long long now;
    if (now_ns(hot, &now) < 0) {
        Py_DECREF(h);
        Py_DECREF(end);
        return -1;
    }
    self->t0 = now;
    self->state = STATE_OPEN;
    PyObject *last = h->ev == Py_None ? NULL : h->ev;
    int same = 0;
    if (last && h->seq == hot->last_exit && now - h->t1 < hot->chain_gap_ns && h->stream) {
        same = h->stream == stream ? 1 : PyObject_RichCompareBool(h->stream, stream, Py_EQ);
        if (same < 0) {
            Py_DECREF(h);
            Py_DECREF(end);
            return -1;
        }
    }
    if (same) {
        LASTEND_TAKE(h, last);
        rc = set_ev(self, last, end, empty_tuple);
        Py_DECREF(last);
        if (rc < 0) {  /* the previous end is lost to the pool (no memory): stop the step, keep serving */
            Py_DECREF(h);
            Py_DECREF(end);
            return -1;
        }
    } else {
        rc = start_fresh(self, hot, end, stream, h);
    }
    Py_DECREF(h);
    Py_DECREF(end);
    return rc;
}

static int enter_body(Step *self, Hot *hot) {
    if (hot->is_capturing_fn) {
        /* the stream the step's events go on, asked directly (torch's check costs a runtime call more) */
        PyObject *stream = PyObject_CallNoArgs(hot->stream);
        if (!stream) return -1;
        Py_XSETREF(self->stream, stream);
        void *s = PyLong_AsVoidPtr(stream);
        if (!s && PyErr_Occurred()) return -1;
        int status = 0;
        int code = hot->is_capturing_fn(s, &status);
        if (code == CUDA_ERROR_INVALID_CONTEXT && ensure_context(hot) == 0) code = hot->is_capturing_fn(s, &status);
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
    if (hot->pool_pop == NULL) {
        if (now_ns(hot, &self->t0) < 0) return -1;
        self->state = STATE_OPEN;
    } else if (hot->every > 1 && (++hot->count) % hot->every != 0) {
        Py_XSETREF(self->ev, Py_NewRef(Py_False));  /* not sampled (timing_every): counted, not timed */
        if (now_ns(hot, &self->t0) < 0) return -1;
        self->state = STATE_OPEN;
    } else if (enter_timed(self, hot) < 0) {
        return -1;
    }
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
        PyObject *saved = Py_BuildValue("(iLOO)", self->state, self->t0, self->ev ? self->ev : Py_None,
                                        self->stream ? self->stream : Py_None);
        if (!saved) return NULL;
        int rc = PyList_Append(self->outer, saved);
        Py_DECREF(saved);
        if (rc < 0) return NULL;
        Py_CLEAR(self->ev);  /* the outer entry's events are not this entry's to give back */
        Py_CLEAR(self->stream);
        self->state = STATE_IDLE;
    }
    if (enter_body(self, hot) < 0) {
        if (swallow(hot, self->phase, str_enter_where) < 0) return NULL;
        step_abandon(self);
    }
    return Py_NewRef(self);
}

static int exit_body(Step *self, Hot *hot, long long t0, PyObject **evp, PyObject *stream, PyObject *exc_type) {
    PyObject *ev = *evp;
    long long t1;
    if (now_ns(hot, &t1) < 0) {
        if (ev && PyTuple_Check(ev)) give_back_keeping_error(hot, ev);  /* the end was never recorded */
        return -1;
    }
    if (ev && PyTuple_Check(ev)) {
        long long before = hot->exit_seq;
        if (record(hot, PyTuple_GET_ITEM(ev, 1), stream) < 0) {
            give_back_keeping_error(hot, ev);
            return -1;
        }
        LastEnd *h = thread_last(hot);
        if (!h) {  /* recorded, but held by no one: given back once the collector has read past it */
            saved_exc saved = exc_save();
            PyObject *start = PyTuple_GET_ITEM(ev, 0);
            PyObject *head = start == Py_None ? PyTuple_Pack(1, PyTuple_GET_ITEM(ev, 1))
                                              : PyTuple_Pack(2, start, PyTuple_GET_ITEM(ev, 1));
            PyObject *all = head ? PySequence_Concat(head, PyTuple_GET_ITEM(ev, 2)) : NULL;
            PyObject *r = all ? PyObject_Call(hot->orphan, all, NULL) : NULL;
            Py_XDECREF(r);
            Py_XDECREF(all);
            Py_XDECREF(head);
            PyErr_Clear();
            exc_restore(saved);
            return -1;
        }
        PyObject *inner;  /* a nested step's end on this thread: given back after this step is read */
        LASTEND_TAKE(h, inner);
        h->ev = Py_NewRef(PyTuple_GET_ITEM(ev, 1));
        Py_XSETREF(h->stream, Py_NewRef(stream));
        h->t1 = t1;
        long long seq = ++hot->exit_seq;
        /* another thread's step exited while the record ran (it released the GIL): its GPU work may sit
           after this end event on the stream, so the next step must not start from it */
        h->seq = seq == before + 1 ? seq : -1;
        hot->last_exit = seq;
        Py_DECREF(h);
        if (inner) {
            PyObject *more = PyTuple_Pack(1, inner);
            Py_DECREF(inner);
            PyObject *others = more ? PySequence_Concat(PyTuple_GET_ITEM(ev, 2), more) : NULL;
            Py_XDECREF(more);
            PyObject *t = others ? PyTuple_Pack(3, PyTuple_GET_ITEM(ev, 0), PyTuple_GET_ITEM(ev, 1), others) : NULL;
            Py_XDECREF(others);
            if (!t) return -1;
            Py_SETREF(*evp, t);
            ev = t;
        }
    } else if (ev == Py_False) {
        hot->exit_seq++;     /* every exit is numbered: a timed step's exit can tell that one came between */
        hot->last_exit = 0;  /* an untimed step: the next timed one must not start before it */
    }
    Py_ssize_t queued = PyObject_Length(hot->queue);
    if (queued < 0) return -1;
    if (queued < hot->queue_cap) {
        PyObject *rec = PyTuple_New(10);
        if (!rec) return -1;
        PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1);
        PyObject *err = Py_None;
        if (exc_type != Py_None) {
            err = PyObject_GetAttr(exc_type, str_qualname);
            if (!err) PyErr_Clear(), err = Py_NewRef(Py_None);
        } else {
            Py_INCREF(err);
        }
        if (!a || !b) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            Py_DECREF(err);
            Py_DECREF(rec);
            return -1;
        }
        PyTuple_SET_ITEM(rec, 0, Py_NewRef(str_step_tag));
        PyTuple_SET_ITEM(rec, 1, Py_NewRef(self->phase));
        PyTuple_SET_ITEM(rec, 2, a);
        PyTuple_SET_ITEM(rec, 3, b);
        PyTuple_SET_ITEM(rec, 4, Py_NewRef(ev ? ev : Py_None));
        PyTuple_SET_ITEM(rec, 5, Py_NewRef(self->batch));
        PyTuple_SET_ITEM(rec, 6, Py_NewRef(self->tokens));
        PyTuple_SET_ITEM(rec, 7, Py_NewRef(self->ctx));
        PyTuple_SET_ITEM(rec, 8, Py_NewRef(self->seq_lens));
        PyTuple_SET_ITEM(rec, 9, err);
        PyObject *r = PyObject_CallOneArg(hot->queue_append, rec);
        Py_DECREF(rec);
        if (!r) return -1;
        Py_DECREF(r);
    } else {
        if (PyErr_Occurred()) return -1;
        hot->dropped++;  /* the collector is behind: count it, never wait */
        if (ev && PyTuple_Check(ev)) {  /* given back once the collector has read past them */
            PyObject *start = PyTuple_GET_ITEM(ev, 0), *others = PyTuple_GET_ITEM(ev, 2);
            PyObject *head = PyTuple_Pack(1, start);
            PyObject *all = head ? PySequence_Concat(head, others) : NULL;
            Py_XDECREF(head);
            if (!all) return -1;
            PyObject *r = PyObject_Call(hot->orphan, all, NULL);
            Py_DECREF(all);
            if (!r) return -1;
            Py_DECREF(r);
        }
    }
    return window_hook(hot, str_step_end, self->phase);
}

static PyObject *step_exit(Step *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes exactly 3 arguments");
        return NULL;
    }
    Hot *hot = self->hot;
    int state = self->state;
    long long t0 = self->t0;
    PyObject *ev = self->ev, *stream = self->stream;  /* references move to these locals */
    self->ev = NULL;
    self->stream = NULL;
    self->state = STATE_IDLE;
    if (self->outer && PyList_GET_SIZE(self->outer) > 0) {
        Py_ssize_t n = PyList_GET_SIZE(self->outer);
        PyObject *saved = PyList_GET_ITEM(self->outer, n - 1);
        int st;
        long long t;
        PyObject *e, *s;
        if (PyArg_ParseTuple(saved, "iLOO", &st, &t, &e, &s)) {
            self->state = st;
            self->t0 = t;
            self->ev = e == Py_None ? NULL : Py_NewRef(e);
            self->stream = s == Py_None ? NULL : Py_NewRef(s);
        } else {
            PyErr_Clear();
        }
        PyList_SetSlice(self->outer, n - 1, n, NULL);
    }
    if (state == STATE_OPEN) {
        if (hot->nvtx_on) {  /* first: the range closes even if what follows fails */
            PyObject *r = PyObject_CallNoArgs(hot->nvtx_pop);
            if (r) Py_DECREF(r);
            else if (swallow(hot, self->phase, str_nvtx_where) < 0) goto fail;  /* the step is still timed */
        }
        if (exit_body(self, hot, t0, &ev, stream ? stream : Py_None, args[0]) < 0 &&
            swallow(hot, self->phase, str_exit_where) < 0)
            goto fail;
    }
    Py_XDECREF(ev);
    Py_XDECREF(stream);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(ev);
    Py_XDECREF(stream);
    return NULL;
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
    return PyTuple_Pack(4, self->batch, self->tokens, self->ctx, self->seq_lens);
}

static PyObject *step_phase(Step *self, void *Py_UNUSED(closure)) { return Py_NewRef(self->phase); }

static PyObject *step_repr(Step *self) {
    return PyUnicode_FromFormat("<perfsdk step %U batch=%R>", self->phase, self->batch);
}

static PyMethodDef step_methods[] = {
    {"__enter__", (PyCFunction)step_enter, METH_NOARGS, "Start the step."},
    {"__exit__", (PyCFunction)(void (*)(void))step_exit, METH_FASTCALL, "End the step."},
    {NULL}
};

static PyGetSetDef step_getset[] = {
    {"phase", (getter)step_phase, NULL, "prefill, decode or mixed", NULL},
    {"sizes", (getter)step_sizes, NULL, "(batch, tokens, context_tokens, seq_lens)", NULL},
    {NULL}
};

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "perfsdk._hotpath.Step",
    .tp_doc = "One prefill, decode or mixed step (perfsdk.Phase's semantics, in C): a context manager and a "
              "decorator. Made by Monitor.prefill/decode/mixed.",
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

/* hot.step(phase, batch, tokens, ctx, seq_lens): a Step; odd sizes go through Python's validation. */
static PyObject *hot_step(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "step(phase, batch, tokens, context_tokens, seq_lens)");
        return NULL;
    }
    PyObject *batch = args[1], *tokens = args[2], *ctx = args[3], *seq_lens = args[4];
    if (PyUnicode_CheckExact(args[0]) && plain_count(batch) && (tokens == Py_None || plain_count(tokens)) &&
        plain_count(ctx) &&
        (seq_lens == Py_None || PyTuple_CheckExact(seq_lens) || PyList_CheckExact(seq_lens)))
        return (PyObject *)step_make(self, args[0], batch, tokens, ctx, seq_lens);
    return PyObject_Vectorcall(self->slow_step, args, 5, NULL);
}

static PyObject *hot_counts(Hot *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("(LL)", self->dropped, self->untimed);
}

static PyMethodDef hot_methods[] = {
    {"step", (PyCFunction)(void (*)(void))hot_step, METH_FASTCALL,
     "step(phase, batch, tokens, context_tokens, seq_lens) -> a step context manager"},
    {"counts", (PyCFunction)hot_counts, METH_NOARGS, "(dropped steps, untimed steps)"},
    {NULL}
};

static PyMemberDef hot_members[] = {
    {"window", T_OBJECT, offsetof(Hot, window), 0, "the Monitor's profiler window (None: none)"},
    {"last_exit", T_LONGLONG, offsetof(Hot, last_exit), READONLY, "exit number of the latest timed step"},
    {"dropped", T_LONGLONG, offsetof(Hot, dropped), READONLY, "steps dropped: the queue was full"},
    {"untimed", T_LONGLONG, offsetof(Hot, untimed), READONLY, "steps not timed: every event in flight"},
    {NULL}
};

static PyObject *hot_make_step(PyObject *self, PyObject *args, PyObject *kw) {
    /* Step(hot, phase, batch, tokens, ctx, seq_lens): already-validated sizes (Python's slow path) */
    PyObject *hot, *phase, *batch, *tokens, *ctx, *seq_lens;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "make_step takes positional arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!UOOOO:make_step", &HotType, &hot, &phase, &batch, &tokens, &ctx, &seq_lens))
        return NULL;
    return (PyObject *)step_make((Hot *)hot, phase, batch, tokens, ctx, seq_lens);
}

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "perfsdk._hotpath.Hot",
    .tp_doc = "One Monitor's hot-path state (built by Monitor._bind_hot).",
    .tp_basicsize = sizeof(Hot),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = hot_new,
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_methods = hot_methods,
    .tp_members = hot_members,
};

static PyMethodDef module_methods[] = {
    {"make_step", (PyCFunction)(void (*)(void))hot_make_step, METH_VARARGS | METH_KEYWORDS,
     "make_step(hot, phase, batch, tokens, context_tokens, seq_lens): a Step from validated sizes"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "perfsdk._hotpath",
    "The step wrappers' enter/exit in C (see perfsdk/_hotpath.c; perfsdk.monitor.Phase is the reference).",
    -1, module_methods,
};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__hotpath(void) {
    INTERN(str_hot, "hot");
    INTERN(str_step_begin, "step_begin");
    INTERN(str_step_end, "step_end");
    INTERN(str_h, "h");
    INTERN(str_qualname, "__qualname__");
    INTERN(str_enter_where, ".__enter__");
    INTERN(str_exit_where, ".__exit__");
    INTERN(str_nvtx_where, ".__exit__ nvtx");
    INTERN(str_step_tag, "s");
    if (!(empty_tuple = PyTuple_New(0))) return NULL;
    if (PyType_Ready(&LastEndType) < 0 || PyType_Ready(&StepType) < 0 || PyType_Ready(&HotType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "LastEnd", (PyObject *)&LastEndType) < 0 ||
        PyModule_AddObjectRef(m, "Step", (PyObject *)&StepType) < 0 ||
        PyModule_AddObjectRef(m, "Hot", (PyObject *)&HotType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
