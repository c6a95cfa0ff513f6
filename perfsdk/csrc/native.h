/* perfsdk._native: what the hot path and the step core share.
 *
 * The hot path (hotpath.c) runs on serving threads with the GIL held; the step core (stepcore.c) runs on
 * a native thread that never takes it. They meet in three places, all here:
 *
 *   StepRecord  one step, the C twin of perfsdk.records.StepRecord (the same fields in the same order,
 *               the same meaning);
 *   Ring        a single-producer, single-consumer ring of StepRecords. Producers are serving threads,
 *               serialised by the GIL (every push happens inside one C call holding it); the consumer is
 *               the core's thread. Lock-free: the producer publishes with a release store of `head`, the
 *               consumer frees slots with a release store of `tail`. A full ring drops (counted), never
 *               waits;
 *   Pool        CUDA events by slot, each with an atomic reference count (a step holds its start and end,
 *               a thread holds its last end); the last holder puts the slot back on the free stack,
 *               guarded by a mutex nobody holds while calling out.
 *
 * The core's mutex guards its totals; no code holds it while calling a driver function or Python.
 *
 * What the core hands back to Python is named too: records.c defines the struct sequences (PhaseTotals,
 * StepSample, WindowFeedEntry, ValueFeedEntry, StepTotals, RecentSteps) with the fields of the
 * perfsdk.records types of the same names, and the constants both languages share.
 */
#ifndef PERFSDK_NATIVE_H
#define PERFSDK_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* perfsdk.records' PREFILL, DECODE, MIXED and TIMED, HOST, UNTIMED (exported under those names: checked equal) */
enum { PHASE_PREFILL = 0, PHASE_DECODE = 1, PHASE_MIXED = 2, NPHASES = 3 };
enum { TIMING_TIMED = 0, TIMING_HOST = 1, TIMING_UNTIMED = 2 };
#define NSTEP_MAX 64 /* histogram bounds the core holds at most (exported as MAX_STEP_BOUNDS) */
#define NUTIL_MAX 32 /* ... for MBU and MFU (MAX_UTIL_BOUNDS) */

#define NO_EVENT (-1)
#define NO_TOKENS (-1)
#define UNSIZED (-1) /* StepRecord.context_tokens of a step with no sizes (perfsdk.records.UNSIZED) */
#define LENS_SQ_MAX (((int64_t)1) << 62) /* a step's sum of squared lengths stays below (perfsdk.hotpath) */
#define MAX_ERROR_NAMES 64
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_INVALID_CONTEXT 201

/* perfsdk.records.StepRecord's fields, in its order */
typedef struct {
    int32_t phase;          /* PHASE_* */
    int32_t timing;         /* TIMING_* */
    int64_t t0, t1;         /* host clock (ns) */
    int32_t start, end;     /* event slots (TIMED), else NO_EVENT */
    int64_t batch, tokens, context_tokens;
    int64_t lens_sum, lens_sq, lens_count;
    int32_t error;          /* 0: none; else 1 + index into the core's error names */
} StepRecord;

typedef struct {
    StepRecord *buf;
    uint64_t cap;
    _Atomic uint64_t head;  /* written by producers (under the GIL) */
    _Atomic uint64_t tail;  /* written by the consumer (the core's thread) */
} Ring;

typedef int (*cu_record_t)(void *event, void *stream);
typedef int (*cu_is_capturing_t)(void *stream, int *status);
typedef int (*cu_event_t)(void *event);
typedef int (*cu_elapsed_t)(float *ms, void *start, void *end);
typedef int (*cu_ctx_set_t)(void *context);
typedef int (*cu_exchange_mode_t)(int *mode);

typedef struct {
    uintptr_t *handle;   /* [cap] the events (CUevent handles) */
    atomic_int *refs;    /* [cap] holders of each slot */
    int32_t *free;       /* [cap] a stack of free slots */
    int32_t nfree;
    int32_t created;
    int32_t cap;
    pthread_mutex_t lock;
} Pool;

typedef struct StepCore StepCore;

/* Reading a Python object's fields at construction (the HotState, the StepCosts, the DriverAddresses):
   *ok goes to 0, with an exception set, when an attribute is missing or of the wrong type. */
static inline long long attr_ll(PyObject *o, const char *name, int *ok) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v) {
        *ok = 0;
        return 0;
    }
    long long r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (r == -1 && PyErr_Occurred()) *ok = 0;
    return r;
}

static inline double attr_double(PyObject *o, const char *name, int *ok) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v) {
        *ok = 0;
        return 0;
    }
    double d = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (d == -1.0 && PyErr_Occurred()) *ok = 0;
    return d;
}

static inline void *attr_address(PyObject *o, const char *name, int *ok) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v) {
        *ok = 0;
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    if (!p && PyErr_Occurred()) *ok = 0;
    return p;
}

/* stepcore.c */
extern PyTypeObject StepCoreType;
int core_push(StepCore *core, const StepRecord *rec);   /* 1 queued, 0 dropped (counted); GIL held */
int32_t core_acquire(StepCore *core);                   /* an event slot with one reference, NO_EVENT if none */
uintptr_t core_handle(StepCore *core, int32_t slot);
void core_hold(StepCore *core, int32_t slot);           /* one more reference (the caller holds one) */
void core_unref(StepCore *core, int32_t slot);          /* one fewer; the last puts the slot back */
int core_error_name(StepCore *core, PyObject *name);    /* 1 + index of an exception type's name, 0 if none */
int core_has_events(StepCore *core);
int init_stepcore(PyObject *module);

/* hotpath.c */
int init_hotpath(PyObject *module);

/* records.c */
extern PyTypeObject PhaseTotalsType, StepSampleType, WindowFeedEntryType, ValueFeedEntryType, StepTotalsType,
    RecentStepsType;
int init_records(PyObject *module);

#endif
