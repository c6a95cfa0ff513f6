/* perfsdk._native.StepCore: the step core in C, on a native thread that never takes the GIL.
 *
 * The same algorithm as perfsdk/stepcore.py's PyStepCore (read that first: it is the specification, and
 * tests/test_stepcore.py feeds both the same steps and compares every output): read step records in
 * order from the ring, wait for a timed step's end event (the newest pending step's, so one wake-up reads
 * a run of steps; a query every poll interval, sleeping between, or cuEventSynchronize where the events are
 * blocking-sync ones), read the device time,
 * let go of the events, price the step (the coefficients of perfsdk.stepcost.StepCosts, the same
 * floating-point operations in the same order as its named formulas), and count it into per-phase histogram
 * buckets and sums, counters, the last steps for stats() (RecentSteps), sampled steps for spans and, while a
 * profiler window or an OpenTelemetry metrics sink listens, the window feed and the value feed. The
 * capacities of those buffers are given when the core is built (perfsdk.records defines them once).
 *
 * Python reads all of that only when it asks (take(), recent(), sync()), with the GIL, taking the core's
 * mutex for a copy, as the struct sequences of records.c. The core's thread never calls Python: driver
 * functions are called through their addresses (a scripted GPU in the tests gives ctypes callbacks, which
 * take the GIL themselves, and are never called with the mutex held).
 *
 * It runs over 500 lines on purpose: the core's thread (ring, pending steps, waits, counting) and the Python
 * type that starts, reads and resets it share the StepCore struct and its locking rules; kept in one
 * translation unit, every access to the struct and the mutex is in one file, and the counting path inlines.
 */
#include "native.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

#define MAX_SITES 64

typedef struct {
    int64_t steps, errors;
    int64_t step_counts[NSTEP_MAX + 1];
    double step_sum;
    int64_t mbu_counts[NUTIL_MAX + 1];
    double mbu_sum;
    int64_t mfu_counts[NUTIL_MAX + 1];
    double mfu_sum;
    double bytes, flops;
    int64_t tokens;
} PhaseTotals;

typedef struct {
    int32_t phase, error;
    int64_t t0, t1, batch, tokens;
    double seconds, mbu, mfu;  /* NAN: none */
} Sample;

typedef struct {
    double seconds, mbu;
    int64_t batch;
} Feed;

typedef struct {
    int32_t phase;
    double seconds, mbu, mfu; /* NAN: none */
} Value;

typedef struct {
    int64_t steps, errors;
    double *seconds, *mbu, *mfu;      /* [recent_cap] each, circular */
    int64_t n_seconds, n_mbu, n_mfu;  /* values ever added */
} Recent;

typedef struct {
    const char *site;
    char message[160];
} Site;

struct StepCore {
    PyObject_HEAD
    /* costs (perfsdk.stepcost.StepCosts) */
    int known, kv;
    double weight_bytes, row_bytes, kv_bytes_per_token, two_params, attn_decode, attn_causal, attn_prefix;
    double bandwidth, peak_flops;
    double step_bounds[NSTEP_MAX], util_bounds[NUTIL_MAX];
    int nstep, nutil;
    double span_rate;
    double poll, idle_max;
    /* capacities (perfsdk.records: RECENT, SAMPLES, WINDOW_FEED, VALUE_FEED), given at construction */
    int64_t recent_cap, samples_cap, feed_cap, values_cap;
    /* events */
    cu_event_t query, synchronize;
    cu_elapsed_t elapsed;
    cu_ctx_set_t ctx_set;
    void *context;
    cu_exchange_mode_t exchange_mode;
    Pool pool;
    PyObject *new_event, *destroy_event;
    /* records */
    Ring ring;
    StepRecord *pending;  /* circular: timed steps whose end has not been read */
    uint64_t pending_cap, pending_head, pending_len;
    int64_t dropped;      /* records refused: the ring was full (producers, under the GIL) */
    _Atomic int64_t done; /* records fully counted */
    /* the thread */
    pthread_t thread;
    int started;
    _Atomic int running, stop, paused, feed_window, feed_values;
    pthread_mutex_t wake_lock;
    pthread_cond_t wake_cond;
    int wake_flag;
    /* results, under `lock` */
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    PhaseTotals totals[NPHASES];
    Recent recent[NPHASES];
    Sample *samples;      /* [samples_cap] */
    int64_t nsamples;
    int64_t sampled;
    Feed *feed;           /* [feed_cap]: the window feed */
    int64_t nfeed;        /* decode steps fed since the last take (circular beyond feed_cap) */
    Value *values;        /* [values_cap]: the value feed, timed steps since the last take, while feed_values */
    int64_t nvalues;
    int64_t values_dropped; /* ... beyond values_cap */
    int64_t errors;       /* CUDA errors reading events, and negative durations refused */
    int64_t dropped_samples; /* sampled steps beyond SAMPLES between two takes: spans never built */
    Site sites[MAX_SITES];
    int nsites;
    /* exception type names of failed steps (GIL) */
    PyObject *error_names;  /* a list of str */
};

/* ------------------------------------------------------------------------------------------ the pool */

static int pool_init(Pool *p, int cap) {
    memset(p, 0, sizeof(*p));
    p->cap = cap;
    if (cap > 0) {
        p->handle = PyMem_RawCalloc((size_t)cap, sizeof(uintptr_t));
        p->refs = PyMem_RawCalloc((size_t)cap, sizeof(atomic_int));
        p->free = PyMem_RawCalloc((size_t)cap, sizeof(int32_t));
        if (!p->handle || !p->refs || !p->free) return -1;
    }
    return pthread_mutex_init(&p->lock, NULL) == 0 ? 0 : -1;
}

/* A new event in a new slot (GIL held: only serving threads and the constructor create). -2 on error. */
static int32_t pool_create(StepCore *core) {
    Pool *p = &core->pool;
    PyObject *ev = PyObject_CallNoArgs(core->new_event);
    if (!ev) return -2;  /* an exception is set */
    uintptr_t h = (uintptr_t)PyLong_AsVoidPtr(ev);
    Py_DECREF(ev);
    if (!h && PyErr_Occurred()) return -2;
    pthread_mutex_lock(&p->lock);
    int32_t slot = p->created++;
    p->handle[slot] = h;
    pthread_mutex_unlock(&p->lock);
    return slot;
}

int32_t core_acquire(StepCore *core) {
    Pool *p = &core->pool;
    int32_t slot = NO_EVENT;
    pthread_mutex_lock(&p->lock);
    if (p->nfree > 0) slot = p->free[--p->nfree];
    int can_create = slot == NO_EVENT && p->created < p->cap;
    pthread_mutex_unlock(&p->lock);
    if (can_create && (slot = pool_create(core)) == -2) return -2;
    if (slot >= 0) atomic_store(&p->refs[slot], 1);
    return slot;
}

uintptr_t core_handle(StepCore *core, int32_t slot) { return core->pool.handle[slot]; }

void core_hold(StepCore *core, int32_t slot) { atomic_fetch_add(&core->pool.refs[slot], 1); }

void core_unref(StepCore *core, int32_t slot) {
    Pool *p = &core->pool;
    if (slot < 0 || slot >= p->cap) return;
    if (atomic_fetch_sub(&p->refs[slot], 1) == 1) {
        pthread_mutex_lock(&p->lock);
        p->free[p->nfree++] = slot;
        pthread_mutex_unlock(&p->lock);
    }
}

int core_has_events(StepCore *core) { return core->pool.cap > 0; }

/* ------------------------------------------------------------------------------------------ the ring */

int core_push(StepCore *core, const StepRecord *rec) {
    Ring *r = &core->ring;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (head - tail >= r->cap) {
        core->dropped++;
        return 0;
    }
    r->buf[head % r->cap] = *rec;
    atomic_store_explicit(&r->head, head + 1, memory_order_release);
    return 1;
}

static int ring_pop(Ring *r, StepRecord *out) {
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    if (tail == head) return 0;
    *out = r->buf[tail % r->cap];
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    return 1;
}

static int ring_empty(Ring *r) {
    return atomic_load_explicit(&r->tail, memory_order_relaxed) ==
           atomic_load_explicit(&r->head, memory_order_acquire);
}

int core_error_name(StepCore *core, PyObject *name) {
    Py_ssize_t n = PyList_GET_SIZE(core->error_names);
    for (Py_ssize_t i = 0; i < n; i++) {
        int eq = PyUnicode_Compare(PyList_GET_ITEM(core->error_names, i), name);
        if (eq == 0) return (int)i + 1;
        if (eq == -1 && PyErr_Occurred()) return -1;
    }
    if (n >= MAX_ERROR_NAMES) return 1;  /* beyond 64 distinct names: reported as the first one */
    if (PyList_Append(core->error_names, name) < 0) return -1;
    return (int)n + 1;
}

/* ------------------------------------------------------------------------------------- counting */

static void add_site_message(StepCore *c, const char *site, const char *message) {
    /* under c->lock: one internal error, and its site and message while there is room for them */
    c->errors++;
    if (c->nsites < MAX_SITES) {
        Site *s = &c->sites[c->nsites++];
        s->site = site;
        snprintf(s->message, sizeof(s->message), "%s", message);
    }
}

static void add_site(StepCore *c, const char *site, const char *what, int code) {
    /* under c->lock */
    char message[sizeof(((Site *)0)->message)];
    snprintf(message, sizeof(message), "%s failed (CUDA error %d)", what, code);
    add_site_message(c, site, message);
}

/* A negative duration (perfsdk.stepcore's CLOCK_BACKWARDS, ELAPSED_NEGATIVE: the same text). */
static const char CLOCK_BACKWARDS[] =
    "a step's host clock went backwards (it ended before it began): its time is not observed";
static const char ELAPSED_NEGATIVE[] = "a step's device time read negative: its time is not observed";

static void core_problem(StepCore *c, const char *site, const char *message) {
    pthread_mutex_lock(&c->lock);
    add_site_message(c, site, message);
    pthread_mutex_unlock(&c->lock);
}

static int bucket(const double *bounds, int n, double v) {
    for (int i = 0; i < n; i++)
        if (v <= bounds[i]) return i;
    return n;
}

static int sample_now(StepCore *c) {
    double rate = c->span_rate;
    if (rate <= 0) return 0;
    int64_t n = ++c->sampled;
    return floor((double)n * rate) > floor((double)(n - 1) * rate);
}

static void add_sample(StepCore *c, const StepRecord *r, double seconds, int64_t tokens, double mbu, double mfu) {
    if (c->nsamples >= c->samples_cap) {
        c->dropped_samples++;
        return;
    }
    Sample *s = &c->samples[c->nsamples++];
    s->phase = r->phase;
    s->error = r->error;
    s->t0 = r->t0;
    s->t1 = r->t1;
    s->batch = r->batch;
    s->tokens = tokens;
    s->seconds = seconds;
    s->mbu = mbu;
    s->mfu = mfu;
}

static void recent_add(double *arr, int64_t *n, double v, int64_t cap) { arr[(*n)++ % cap] = v; }

/* (bytes, FLOPs, tokens): perfsdk.stepcost.StepCosts.cost and the named formulas it calls (decode_bytes,
   decode_flops, prefill_bytes, prefill_flops, attention_flops, mixed_bytes, mixed_flops), operation for
   operation. */
static void cost(const StepCore *c, const StepRecord *r, double *nbytes, double *flops, int64_t *ntokens) {
    *nbytes = *flops = NAN;
    if (r->context_tokens < 0) { /* UNSIZED: a step with no sizes (a bare @mon.decode) */
        *ntokens = 0;
        return;
    }
    if (r->phase == PHASE_DECODE) {
        *ntokens = r->batch;
        if (!c->known) return;
        *nbytes = c->weight_bytes + c->row_bytes * (double)r->batch + c->kv_bytes_per_token * (double)r->context_tokens;
        *flops = c->two_params * (double)r->batch + c->attn_decode * (double)r->context_tokens;
        return;
    }
    if (r->phase == PHASE_PREFILL) {
        *ntokens = r->lens_sum;
        if (!c->known) return;
        double linear = c->two_params * (double)r->lens_sum;
        double weights = c->weight_bytes + c->row_bytes * (double)r->lens_sum;
        if (!c->kv) {
            *nbytes = weights;
            *flops = linear;
            return;
        }
        double prefix = (r->context_tokens && r->lens_count)
                            ? c->attn_prefix * (double)r->context_tokens * (double)r->lens_sum / (double)r->lens_count
                            : 0.0;
        *nbytes = weights + c->kv_bytes_per_token * (double)(r->lens_sum + r->context_tokens);
        *flops = linear + (c->attn_causal * (double)r->lens_sq + prefix);
        return;
    }
    int64_t n = r->lens_sum + r->batch;
    *ntokens = n;
    if (!c->known) return;
    double decode_flops = c->two_params * (double)r->batch + c->attn_decode * (double)r->context_tokens;
    double weights = c->weight_bytes + c->row_bytes * (double)n;
    if (!c->kv) {
        *nbytes = weights;
        *flops = c->two_params * (double)r->lens_sum + decode_flops;
        return;
    }
    *nbytes = weights + c->kv_bytes_per_token * (double)(r->context_tokens + r->lens_sum);
    double prefill_flops = c->two_params * (double)r->lens_sum + (c->attn_causal * (double)r->lens_sq + 0.0);
    *flops = prefill_flops + decode_flops;
}

/* One step into the totals (PyStepCore._count). seconds: NAN when not timed. */
static void count_step(StepCore *c, const StepRecord *r, double seconds) {
    pthread_mutex_lock(&c->lock);
    int sampled = sample_now(c);
    PhaseTotals *t = &c->totals[r->phase];
    Recent *rc = &c->recent[r->phase];
    t->steps++;
    rc->steps++;
    if (r->error) {
        t->errors++;
        rc->errors++;
        if (sampled) add_sample(c, r, NAN, 0, NAN, NAN);
        pthread_mutex_unlock(&c->lock);
        return;
    }
    double nbytes, flops;
    int64_t ntokens;
    cost(c, r, &nbytes, &flops, &ntokens);
    double mbu = NAN, mfu = NAN;
    if (!isnan(seconds) && seconds > 0) {
        if (!isnan(nbytes) && c->bandwidth > 0 && r->phase != PHASE_PREFILL) mbu = nbytes / (seconds * c->bandwidth);
        if (!isnan(flops) && c->peak_flops > 0 && r->phase != PHASE_DECODE) mfu = flops / (seconds * c->peak_flops);
    }
    if (!isnan(seconds)) {
        t->step_counts[bucket(c->step_bounds, c->nstep, seconds)]++;
        t->step_sum += seconds;
        t->bytes += !isnan(nbytes) ? nbytes : 0.0;
        t->flops += !isnan(flops) ? flops : 0.0;
        recent_add(rc->seconds, &rc->n_seconds, seconds, c->recent_cap);
    }
    if (!isnan(mbu)) {
        t->mbu_counts[bucket(c->util_bounds, c->nutil, mbu)]++;
        t->mbu_sum += mbu;
        recent_add(rc->mbu, &rc->n_mbu, mbu, c->recent_cap);
    }
    if (!isnan(mfu)) {
        t->mfu_counts[bucket(c->util_bounds, c->nutil, mfu)]++;
        t->mfu_sum += mfu;
        recent_add(rc->mfu, &rc->n_mfu, mfu, c->recent_cap);
    }
    t->tokens += ntokens;
    if (sampled) add_sample(c, r, seconds, ntokens, mbu, mfu);
    if (atomic_load(&c->feed_window) && r->phase == PHASE_DECODE && !isnan(seconds)) {
        Feed *f = &c->feed[c->nfeed++ % c->feed_cap];
        f->seconds = seconds;
        f->batch = r->batch;
        f->mbu = mbu;
    }
    if (atomic_load(&c->feed_values) && !isnan(seconds)) {
        if (c->nvalues < c->values_cap) {
            Value *v = &c->values[c->nvalues++];
            v->phase = r->phase;
            v->seconds = seconds;
            v->mbu = mbu;
            v->mfu = mfu;
        } else {
            c->values_dropped++;
        }
    }
    pthread_mutex_unlock(&c->lock);
}

static void finish_one(StepCore *c) {
    pthread_mutex_lock(&c->lock);
    atomic_fetch_add(&c->done, 1);
    pthread_cond_broadcast(&c->done_cond);
    pthread_mutex_unlock(&c->lock);
}

static void core_error(StepCore *c, const char *site, const char *what, int code) {
    pthread_mutex_lock(&c->lock);
    add_site(c, site, what, code);
    pthread_mutex_unlock(&c->lock);
}

static void let_go(StepCore *c, const StepRecord *r) {
    if (r->start != NO_EVENT) core_unref(c, r->start);
    if (r->end != NO_EVENT) core_unref(c, r->end);
}

/* -------------------------------------------------------------------------------- the core's thread */

static void *ev(StepCore *c, int32_t slot) { return (void *)c->pool.handle[slot]; }

static void sleep_idle(StepCore *c, double seconds);

/* Block until event *e* completes: cuEventSynchronize where the events are blocking-sync ones, else (no
   synchronize address: perfsdk's own events, made without CU_EVENT_BLOCKING_SYNC, whose records cost the GPU
   less) a query every poll interval, sleeping between (sync() and stop() wake it). */
static int wait_event(StepCore *c, void *e) {
    if (c->synchronize) return c->synchronize(e);
    for (;;) {
        int q = c->query(e);
        if (q != CUDA_ERROR_NOT_READY) return q;
        sleep_idle(c, c->poll);
    }
}

/* Wait for the newest pending step's end: 1 when waited, 0 when done already or it cannot be waited on. */
static int wait_newest(StepCore *c, int32_t newest) {
    int q = c->query(ev(c, newest));
    if (q == 0) return 0;
    if (q != CUDA_ERROR_NOT_READY) return 0;
    return wait_event(c, ev(c, newest)) == 0;
}

static void resolve(StepCore *c, int block) {
    int32_t waited = NO_EVENT;  /* waited for once already: a query that still says "not ready" is not believed */
    while (c->pending_len) {
        StepRecord *r = &c->pending[c->pending_head % c->pending_cap];
        double seconds = NAN;
        int q = c->query(ev(c, r->end));
        if (q == CUDA_ERROR_NOT_READY) {
            if (!block) return;
            int32_t newest = c->pending[(c->pending_head + c->pending_len - 1) % c->pending_cap].end;
            if (newest != r->end && newest != waited && wait_newest(c, newest)) {
                waited = newest;
                continue;  /* re-check the oldest */
            }
            q = wait_event(c, ev(c, r->end));
            if (q) core_error(c, "core event", c->synchronize ? "cuEventSynchronize" : "cuEventQuery", q);
        } else if (q) {
            core_error(c, "core event", "cuEventQuery", q);
        }
        if (!q) {
            float ms = 0;
            int e = c->elapsed(&ms, ev(c, r->start), ev(c, r->end));
            if (e) core_error(c, "core event", "cuEventElapsedTime", e);
            else if (ms < 0) core_problem(c, "core event", ELAPSED_NEGATIVE);
            else seconds = (double)ms / 1e3;
        }
        StepRecord rec = *r;
        c->pending_head++;
        c->pending_len--;
        let_go(c, &rec);
        count_step(c, &rec, seconds);
        finish_one(c);
        if (!ring_empty(&c->ring)) return;  /* go back to reading new records */
    }
}

static void drain(StepCore *c) {
    StepRecord r;
    while (ring_pop(&c->ring, &r)) {
        if (r.timing == TIMING_TIMED && r.error == 0) {
            if (c->pending_len >= c->pending_cap) {  /* cannot happen: each pending step holds its own end */
                let_go(c, &r);
                count_step(c, &r, NAN);
                finish_one(c);
                continue;
            }
            c->pending[(c->pending_head + c->pending_len) % c->pending_cap] = r;
            c->pending_len++;
            resolve(c, 0);
        } else {
            double seconds = NAN;
            if (r.timing == TIMING_HOST) {
                if (r.t1 >= r.t0) seconds = (double)(r.t1 - r.t0) / 1e9;
                else core_problem(c, "core clock", CLOCK_BACKWARDS);
            }
            count_step(c, &r, seconds);
            if (r.timing == TIMING_TIMED) let_go(c, &r);  /* a user error inside a timed step: not read */
            finish_one(c);
        }
    }
}

static void sleep_idle(StepCore *c, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double whole = floor(seconds);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->wake_lock);
    while (!c->wake_flag) {
        if (pthread_cond_timedwait(&c->wake_cond, &c->wake_lock, &ts) == ETIMEDOUT) break;
    }
    c->wake_flag = 0;
    pthread_mutex_unlock(&c->wake_lock);
}

static void wake(StepCore *c) {
    pthread_mutex_lock(&c->wake_lock);
    c->wake_flag = 1;
    pthread_cond_signal(&c->wake_cond);
    pthread_mutex_unlock(&c->wake_lock);
}

static void *core_main(void *arg) {
    StepCore *c = (StepCore *)arg;
#ifdef __linux__
    pthread_setname_np(pthread_self(), "perfsdk-steps");  /* what top -H and /proc/<pid>/task/<tid>/comm show */
#endif
    if (c->ctx_set && c->context) {
        int e = c->ctx_set(c->context);  /* the events' context current on this thread */
        if (e) core_error(c, "core CUDA setup", "cuCtxSetCurrent", e);
    }
    if (c->exchange_mode) {
        /* CUDA's relaxed stream-capture mode: this thread's event queries cannot invalidate a global-mode
           graph capture on another thread (PyTorch's NCCL watchdog does the same) */
        int mode = 2;  /* CU_STREAM_CAPTURE_MODE_RELAXED */
        c->exchange_mode(&mode);
    }
    double idle = c->poll;
    for (;;) {
        int paused = atomic_load(&c->paused);
        if (!paused && !ring_empty(&c->ring)) {
            drain(c);
            idle = c->poll;
        } else if (!paused && c->pending_len) {
            resolve(c, 1);
        } else {
            if (atomic_load(&c->stop) && (paused || (ring_empty(&c->ring) && !c->pending_len))) break;
            sleep_idle(c, idle);
            /* nothing arrived while asleep: sleep longer next time (up to IDLE_MAX); every wake-up costs CPU.
               sync() and stop() wake the thread at once. */
            idle = ring_empty(&c->ring) ? fmin(idle * 2, fmax(c->poll, c->idle_max)) : c->poll;
        }
    }
    pthread_mutex_lock(&c->lock);
    atomic_store(&c->running, 0);
    pthread_cond_broadcast(&c->done_cond);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* ------------------------------------------------------------------------------------- Python type */

static int read_bounds(PyObject *seq, double *out, int max, int *n) {
    PyObject *fast = PySequence_Fast(seq, "bounds must be a sequence");
    if (!fast) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (len > max) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many histogram bounds");
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    *n = (int)len;
    Py_DECREF(fast);
    return 0;
}

static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"costs", "capacity", "span_rate", "poll_interval", "events", "event_capacity",
                             "event_prefill", "new_event", "destroy_event", "step_bounds", "util_bounds", "recent",
                             "samples", "window_feed", "value_feed", "idle_max", NULL};
    PyObject *costs, *events, *new_event, *destroy_event, *step_bounds, *util_bounds;
    Py_ssize_t capacity, event_capacity, event_prefill, recent_cap, samples_cap, feed_cap, values_cap;
    double span_rate, poll, idle_max;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnddOnnOOOO$nnnnd:StepCore", kwlist, &costs, &capacity, &span_rate,
                                     &poll, &events, &event_capacity, &event_prefill, &new_event, &destroy_event,
                                     &step_bounds, &util_bounds, &recent_cap, &samples_cap, &feed_cap, &values_cap,
                                     &idle_max))
        return NULL;
    if (capacity < 1 || event_capacity < 0 || event_capacity > (1 << 24) || !(poll > 0)) {
        PyErr_SetString(PyExc_ValueError, "StepCore: capacity >= 1, 0 <= event_capacity <= 2**24, poll > 0");
        return NULL;
    }
    if (recent_cap < 1 || samples_cap < 0 || feed_cap < 1 || values_cap < 0 || recent_cap > (1 << 24) ||
        samples_cap > (1 << 24) || feed_cap > (1 << 24) || values_cap > (1 << 24) || !(idle_max > 0)) {
        PyErr_SetString(PyExc_ValueError, "StepCore: 1 <= recent, window_feed <= 2**24; 0 <= samples, value_feed "
                                          "<= 2**24; idle_max > 0");
        return NULL;
    }
    if (event_capacity && (events == Py_None || new_event == Py_None || destroy_event == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "StepCore: timing with events needs events, new_event, destroy_event");
        return NULL;
    }
    StepCore *c = (StepCore *)type->tp_alloc(type, 0);
    if (!c) return NULL;
    int ok = 1;
    PyObject *flag = PyObject_GetAttrString(costs, "known");
    c->known = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    flag = PyObject_GetAttrString(costs, "kv");
    c->kv = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    if (c->known < 0 || c->kv < 0) goto fail;
    c->weight_bytes = attr_double(costs, "weight_bytes", &ok);
    c->row_bytes = attr_double(costs, "row_bytes", &ok);
    c->kv_bytes_per_token = attr_double(costs, "kv_bytes_per_token", &ok);
    c->two_params = attr_double(costs, "two_params", &ok);
    c->attn_decode = attr_double(costs, "attn_decode", &ok);
    c->attn_causal = attr_double(costs, "attn_causal", &ok);
    c->attn_prefix = attr_double(costs, "attn_prefix", &ok);
    c->bandwidth = attr_double(costs, "bandwidth", &ok);
    c->peak_flops = attr_double(costs, "peak_flops", &ok);
    if (!ok || PyErr_Occurred() || read_bounds(step_bounds, c->step_bounds, NSTEP_MAX, &c->nstep) < 0 ||
        read_bounds(util_bounds, c->util_bounds, NUTIL_MAX, &c->nutil) < 0)
        goto fail;
    c->span_rate = span_rate;
    c->poll = poll;
    c->idle_max = idle_max;
    c->recent_cap = recent_cap;
    c->samples_cap = samples_cap;
    c->feed_cap = feed_cap;
    c->values_cap = values_cap;
    for (int p = 0; p < NPHASES; p++) {
        Recent *r = &c->recent[p];
        r->seconds = PyMem_RawCalloc((size_t)recent_cap, sizeof(double));
        r->mbu = PyMem_RawCalloc((size_t)recent_cap, sizeof(double));
        r->mfu = PyMem_RawCalloc((size_t)recent_cap, sizeof(double));
        if (!r->seconds || !r->mbu || !r->mfu) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    c->samples = PyMem_RawCalloc((size_t)(samples_cap ? samples_cap : 1), sizeof(Sample));
    c->feed = PyMem_RawCalloc((size_t)feed_cap, sizeof(Feed));
    c->values = PyMem_RawCalloc((size_t)(values_cap ? values_cap : 1), sizeof(Value));
    if (!c->samples || !c->feed || !c->values) {
        PyErr_NoMemory();
        goto fail;
    }
    if (events != Py_None) {
        c->query = (cu_event_t)attr_address(events, "query", &ok);
        c->synchronize = (cu_event_t)attr_address(events, "synchronize", &ok);
        c->elapsed = (cu_elapsed_t)attr_address(events, "elapsed", &ok);
        c->ctx_set = (cu_ctx_set_t)attr_address(events, "ctx_set_current", &ok);
        c->context = (void *)attr_address(events, "context", &ok);
        c->exchange_mode = (cu_exchange_mode_t)attr_address(events, "exchange_capture_mode", &ok);
        if (!ok) goto fail;
        if (event_capacity && (!c->query || !c->elapsed)) {
            PyErr_SetString(PyExc_ValueError, "StepCore: events need query and elapsed addresses");
            goto fail;
        }
    }
    if (pool_init(&c->pool, (int)event_capacity) < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    c->new_event = Py_NewRef(new_event);
    c->destroy_event = Py_NewRef(destroy_event);
    c->ring.cap = (uint64_t)capacity;
    c->ring.buf = PyMem_RawCalloc((size_t)capacity, sizeof(StepRecord));
    c->pending_cap = (uint64_t)(event_capacity ? event_capacity : 1);
    c->pending = PyMem_RawCalloc((size_t)c->pending_cap, sizeof(StepRecord));
    c->error_names = PyList_New(0);
    if (!c->ring.buf || !c->pending || !c->error_names) {
        PyErr_NoMemory();
        goto fail;
    }
    if (pthread_mutex_init(&c->lock, NULL) || pthread_cond_init(&c->done_cond, NULL) ||
        pthread_mutex_init(&c->wake_lock, NULL) || pthread_cond_init(&c->wake_cond, NULL)) {
        PyErr_SetString(PyExc_OSError, "StepCore: pthread init failed");
        goto fail;
    }
    /* a few events up front, so the first steps do not pay for creation */
    for (Py_ssize_t i = 0; i < event_prefill && c->pool.created < c->pool.cap; i++) {
        int32_t s = pool_create(c);
        if (s < 0) goto fail;
        c->pool.free[c->pool.nfree++] = s;
    }
    return (PyObject *)c;
fail:
    Py_DECREF(c);
    return NULL;
}

static int wait_until(StepCore *c, int64_t target, double timeout, int for_stop);

static void core_dealloc(StepCore *c) {
    if (c->started && atomic_load(&c->running)) {  /* never closed: stop the thread before freeing */
        atomic_store(&c->stop, 1);
        wake(c);
        wait_until(c, 0, 2.0, 1);
    }
    int alive = c->started && atomic_load(&c->running);
    if (c->started && !alive) pthread_join(c->thread, NULL);
    Py_CLEAR(c->new_event);
    Py_CLEAR(c->destroy_event);
    Py_CLEAR(c->error_names);
    if (!alive) {  /* a thread stuck in the driver keeps its memory: leaked rather than freed under it */
        PyMem_RawFree(c->ring.buf);
        PyMem_RawFree(c->pending);
        PyMem_RawFree(c->pool.handle);
        PyMem_RawFree(c->pool.refs);
        PyMem_RawFree(c->pool.free);
        for (int p = 0; p < NPHASES; p++) {
            PyMem_RawFree(c->recent[p].seconds);
            PyMem_RawFree(c->recent[p].mbu);
            PyMem_RawFree(c->recent[p].mfu);
        }
        PyMem_RawFree(c->samples);
        PyMem_RawFree(c->feed);
        PyMem_RawFree(c->values);
        Py_TYPE(c)->tp_free((PyObject *)c);
    }  /* else the struct itself stays: the stuck thread still reads it */
}

static PyObject *core_start(StepCore *c, PyObject *Py_UNUSED(ignored)) {
    if (c->started && atomic_load(&c->running)) Py_RETURN_NONE;
    if (c->started) pthread_join(c->thread, NULL);
    atomic_store(&c->stop, 0);
    atomic_store(&c->running, 1);
    if (pthread_create(&c->thread, NULL, core_main, c) != 0) {
        atomic_store(&c->running, 0);
        PyErr_SetString(PyExc_OSError, "StepCore: could not start its thread");
        return NULL;
    }
    c->started = 1;
    Py_RETURN_NONE;
}

/* Wait (GIL released) on done_cond until pred holds or *timeout* passes (negative: no limit). */
static int wait_until(StepCore *c, int64_t target, double timeout, int for_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int limited = timeout >= 0;
    if (limited) {
        double whole = floor(timeout);
        ts.tv_sec += (time_t)whole;
        ts.tv_nsec += (long)((timeout - whole) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&c->lock);
    for (;;) {
        if (for_stop) {
            ok = !atomic_load(&c->running);
        } else {
            ok = atomic_load(&c->done) >= target;
        }
        if (ok) break;
        if (!for_stop && (!atomic_load(&c->running) || atomic_load(&c->paused))) break;
        if (limited) {
            if (pthread_cond_timedwait(&c->done_cond, &c->lock, &ts) == ETIMEDOUT) {
                ok = for_stop ? !atomic_load(&c->running) : atomic_load(&c->done) >= target;
                break;
            }
        } else {
            pthread_cond_wait(&c->done_cond, &c->lock);
        }
    }
    pthread_mutex_unlock(&c->lock);
    Py_END_ALLOW_THREADS
    return ok;
}

static int parse_timeout(PyObject *args, double *timeout) {
    PyObject *t = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &t)) return -1;
    if (t == Py_None) {
        *timeout = -1;
        return 0;
    }
    *timeout = PyFloat_AsDouble(t);
    if (*timeout == -1.0 && PyErr_Occurred()) return -1;
    if (*timeout < 0 || isnan(*timeout)) *timeout = 0;
    return 0;
}

static PyObject *core_stop(StepCore *c, PyObject *args) {
    double timeout;
    if (parse_timeout(args, &timeout) < 0) return NULL;
    if (!c->started) Py_RETURN_TRUE;
    atomic_store(&c->stop, 1);
    wake(c);
    int ok = wait_until(c, 0, timeout, 1);
    if (ok) {
        pthread_join(c->thread, NULL);
        c->started = 0;
    }
    return PyBool_FromLong(ok);
}

static PyObject *core_sync(StepCore *c, PyObject *args) {
    double timeout;
    if (parse_timeout(args, &timeout) < 0) return NULL;
    int64_t target = (int64_t)atomic_load(&c->ring.head);
    if (!c->started || !atomic_load(&c->running) || atomic_load(&c->paused))
        return PyBool_FromLong(atomic_load(&c->done) >= target);
    wake(c);
    return PyBool_FromLong(wait_until(c, target, timeout, 0));
}

static PyObject *core_pause(StepCore *c, PyObject *arg) {
    int p = PyObject_IsTrue(arg);
    if (p < 0) return NULL;
    atomic_store(&c->paused, p);
    wake(c);
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->done_cond);
    pthread_mutex_unlock(&c->lock);
    Py_RETURN_NONE;
}

static PyObject *opt_float(double v) { return isnan(v) ? Py_NewRef(Py_None) : PyFloat_FromDouble(v); }

static PyObject *counts_tuple(const int64_t *counts, int n) {
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(counts[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *error_name(StepCore *c, int32_t error) {
    if (!error) return Py_NewRef(Py_None);
    PyObject *n = PyList_GetItem(c->error_names, error - 1);
    return n ? Py_NewRef(n) : NULL;
}

/* A struct sequence of *type* from *n* new references (NULL ones: an exception is set). Steals them all. */
static PyObject *record_of(PyTypeObject *type, PyObject **items, int n) {
    PyObject *r = NULL;
    int ok = 1;
    for (int i = 0; i < n; i++) ok = ok && items[i];
    if (ok && (r = PyStructSequence_New(type))) {
        for (int i = 0; i < n; i++) PyStructSequence_SET_ITEM(r, i, items[i]);
        return r;
    }
    for (int i = 0; i < n; i++) Py_XDECREF(items[i]);
    return NULL;
}

/* The fields in perfsdk.records' order; records.c names them (tests/test_stepcore.py compares the names). */
static PyObject *phase_totals(const StepCore *c, const PhaseTotals *x) {
    PyObject *f[] = {PyLong_FromLongLong(x->steps), PyLong_FromLongLong(x->errors),
                     counts_tuple(x->step_counts, c->nstep + 1), PyFloat_FromDouble(x->step_sum),
                     counts_tuple(x->mbu_counts, c->nutil + 1), PyFloat_FromDouble(x->mbu_sum),
                     counts_tuple(x->mfu_counts, c->nutil + 1), PyFloat_FromDouble(x->mfu_sum),
                     PyFloat_FromDouble(x->bytes), PyFloat_FromDouble(x->flops), PyLong_FromLongLong(x->tokens)};
    return record_of(&PhaseTotalsType, f, 11);
}

static PyObject *step_sample(StepCore *c, const Sample *x) {
    PyObject *f[] = {PyLong_FromLong(x->phase), PyLong_FromLongLong(x->t0), PyLong_FromLongLong(x->t1),
                     opt_float(x->seconds), PyLong_FromLongLong(x->batch), PyLong_FromLongLong(x->tokens),
                     opt_float(x->mbu), opt_float(x->mfu), error_name(c, x->error)};
    return record_of(&StepSampleType, f, 9);
}

static PyObject *window_feed_entry(const Feed *x) {
    PyObject *f[] = {PyFloat_FromDouble(x->seconds), PyLong_FromLongLong(x->batch), opt_float(x->mbu)};
    return record_of(&WindowFeedEntryType, f, 3);
}

static PyObject *value_feed_entry(const Value *x) {
    PyObject *f[] = {PyLong_FromLong(x->phase), PyFloat_FromDouble(x->seconds), opt_float(x->mbu),
                     opt_float(x->mfu)};
    return record_of(&ValueFeedEntryType, f, 4);
}

/* take() -> perfsdk._native.StepTotals: everything counted since the last take (and reset); perfsdk.stepcore
   hands it on as a perfsdk.records.StepTotals. */
static PyObject *core_take(StepCore *c, PyObject *Py_UNUSED(ignored)) {
    PhaseTotals *t = PyMem_RawMalloc(sizeof(PhaseTotals) * NPHASES);
    Sample *s = PyMem_RawMalloc(sizeof(Sample) * (size_t)(c->samples_cap ? c->samples_cap : 1));
    Feed *f = PyMem_RawMalloc(sizeof(Feed) * (size_t)c->feed_cap);
    Value *v = PyMem_RawMalloc(sizeof(Value) * (size_t)(c->values_cap ? c->values_cap : 1));
    if (!t || !s || !f || !v) {
        PyMem_RawFree(t);
        PyMem_RawFree(s);
        PyMem_RawFree(f);
        PyMem_RawFree(v);
        return PyErr_NoMemory();
    }
    int64_t nsamples, nv, nfeed, vdropped;
    pthread_mutex_lock(&c->lock);
    memcpy(t, c->totals, sizeof(PhaseTotals) * NPHASES);
    memset(c->totals, 0, sizeof(PhaseTotals) * NPHASES);
    nsamples = c->nsamples;
    memcpy(s, c->samples, sizeof(Sample) * (size_t)nsamples);
    c->nsamples = 0;
    nfeed = c->nfeed;
    int64_t first = nfeed > c->feed_cap ? nfeed - c->feed_cap : 0;  /* the latest feed_cap */
    for (int64_t i = first; i < nfeed; i++) f[i - first] = c->feed[i % c->feed_cap];
    c->nfeed = 0;
    nv = c->nvalues;
    memcpy(v, c->values, sizeof(Value) * (size_t)nv);
    c->nvalues = 0;
    vdropped = c->values_dropped;
    c->values_dropped = 0;
    pthread_mutex_unlock(&c->lock);
    int64_t nf = nfeed - first;
    PyObject *phases = PyTuple_New(NPHASES), *samples = PyTuple_New((Py_ssize_t)nsamples);
    PyObject *window_feed = PyTuple_New((Py_ssize_t)nf), *value_feed = PyTuple_New((Py_ssize_t)nv);
    PyObject *out = NULL;
    if (!phases || !samples || !window_feed || !value_feed) goto done;
    for (int p = 0; p < NPHASES; p++) {
        PyObject *item = phase_totals(c, &t[p]);
        if (!item) goto done;
        PyTuple_SET_ITEM(phases, p, item);
    }
    for (int64_t i = 0; i < nsamples; i++) {
        PyObject *item = step_sample(c, &s[i]);
        if (!item) goto done;
        PyTuple_SET_ITEM(samples, (Py_ssize_t)i, item);
    }
    for (int64_t i = 0; i < nf; i++) {
        PyObject *item = window_feed_entry(&f[i]);
        if (!item) goto done;
        PyTuple_SET_ITEM(window_feed, (Py_ssize_t)i, item);
    }
    for (int64_t i = 0; i < nv; i++) {
        PyObject *item = value_feed_entry(&v[i]);
        if (!item) goto done;
        PyTuple_SET_ITEM(value_feed, (Py_ssize_t)i, item);
    }
    PyObject *fields[] = {phases, samples, window_feed, value_feed, PyLong_FromLongLong(vdropped)};
    phases = samples = window_feed = value_feed = NULL;  /* stolen */
    out = record_of(&StepTotalsType, fields, 5);
done:
    Py_XDECREF(phases);
    Py_XDECREF(samples);
    Py_XDECREF(window_feed);
    Py_XDECREF(value_feed);
    PyMem_RawFree(t);
    PyMem_RawFree(s);
    PyMem_RawFree(f);
    PyMem_RawFree(v);
    return out;
}

/* The last values of a circular buffer of *cap* holding *n* ever added (at most cap), as a tuple of floats. */
static PyObject *last_values(const double *arr, int64_t n, int64_t cap) {
    int64_t first = n > cap ? n - cap : 0;
    PyObject *l = PyTuple_New((Py_ssize_t)(n - first));
    if (!l) return NULL;
    for (int64_t i = first; i < n; i++) {
        PyObject *v = PyFloat_FromDouble(arr[i % cap]);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyTuple_SET_ITEM(l, (Py_ssize_t)(i - first), v);
    }
    return l;
}

/* recent(phase) -> perfsdk._native.RecentSteps: the phase's last steps (perfsdk.records.RecentSteps' fields). */
static PyObject *core_recent(StepCore *c, PyObject *arg) {
    long p = PyLong_AsLong(arg);
    if (p == -1 && PyErr_Occurred()) return NULL;
    if (p < 0 || p >= NPHASES) {
        PyErr_SetString(PyExc_ValueError, "phase code 0..2");
        return NULL;
    }
    size_t bytes = sizeof(double) * (size_t)c->recent_cap;
    double *buf = PyMem_RawMalloc(3 * bytes);
    if (!buf) return PyErr_NoMemory();
    Recent r;
    pthread_mutex_lock(&c->lock);
    r = c->recent[p];
    memcpy(buf, r.seconds, bytes);
    memcpy(buf + c->recent_cap, r.mbu, bytes);
    memcpy(buf + 2 * c->recent_cap, r.mfu, bytes);
    pthread_mutex_unlock(&c->lock);
    PyObject *f[] = {PyLong_FromLongLong(r.steps), PyLong_FromLongLong(r.errors),
                     last_values(buf, r.n_seconds, c->recent_cap),
                     last_values(buf + c->recent_cap, r.n_mbu, c->recent_cap),
                     last_values(buf + 2 * c->recent_cap, r.n_mfu, c->recent_cap)};
    PyMem_RawFree(buf);
    return record_of(&RecentStepsType, f, 5);
}

static PyObject *core_take_errors(StepCore *c, PyObject *Py_UNUSED(ignored)) {
    Site sites[MAX_SITES];
    int n;
    pthread_mutex_lock(&c->lock);
    n = c->nsites;
    memcpy(sites, c->sites, sizeof(Site) * (size_t)n);
    c->nsites = 0;
    pthread_mutex_unlock(&c->lock);
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *item = Py_BuildValue("(ss)", sites[i].site, sites[i].message);
        if (!item) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, item);
    }
    return l;
}

/* A StepRecord's fields by name (perfsdk.records.StepRecord), interned at init_stepcore. */
static PyObject *str_phase, *str_timing, *str_t0, *str_t1, *str_start, *str_end, *str_batch, *str_tokens,
    *str_context_tokens, *str_lens_sum, *str_lens_sq, *str_lens_count, *str_error;

static int64_t field_int64(PyObject *rec, PyObject *name, int *ok) {
    if (!*ok) return 0;
    PyObject *v = PyObject_GetAttr(rec, name);
    if (!v) {
        *ok = 0;
        return 0;
    }
    long long r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (r == -1 && PyErr_Occurred()) *ok = 0;
    return r;
}

/* push(record) -> bool: a perfsdk.records.StepRecord with no events (record_step, tests), read field by field
   by name. GIL held. */
static PyObject *core_push_py(StepCore *c, PyObject *rec) {
    PyObject *start = PyObject_GetAttr(rec, str_start), *end = start ? PyObject_GetAttr(rec, str_end) : NULL;
    int none = start == Py_None && end == Py_None;
    Py_XDECREF(start);
    Py_XDECREF(end);
    if (!start || !end) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "push: expected a perfsdk.records.StepRecord");
        }
        return NULL;
    }
    if (!none) {
        PyErr_SetString(PyExc_ValueError, "push: records from Python carry no events");
        return NULL;
    }
    StepRecord r;
    memset(&r, 0, sizeof(r));
    int ok = 1;
    r.phase = (int32_t)field_int64(rec, str_phase, &ok);
    r.timing = (int32_t)field_int64(rec, str_timing, &ok);
    r.t0 = field_int64(rec, str_t0, &ok);
    r.t1 = field_int64(rec, str_t1, &ok);
    r.start = r.end = NO_EVENT;
    r.batch = field_int64(rec, str_batch, &ok);
    r.tokens = field_int64(rec, str_tokens, &ok);
    r.context_tokens = field_int64(rec, str_context_tokens, &ok);
    r.lens_sum = field_int64(rec, str_lens_sum, &ok);
    r.lens_sq = field_int64(rec, str_lens_sq, &ok);
    r.lens_count = field_int64(rec, str_lens_count, &ok);
    if (!ok) return NULL;
    if (r.phase < 0 || r.phase >= NPHASES || r.timing == TIMING_TIMED || r.timing < 0 || r.timing > 2) {
        PyErr_SetString(PyExc_ValueError, "push: bad phase or timing");
        return NULL;
    }
    PyObject *err = PyObject_GetAttr(rec, str_error);
    if (!err) return NULL;
    if (err != Py_None) {
        int e = PyUnicode_Check(err) ? core_error_name(c, err) : -1;
        if (e < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "push: a record's error is a str or None");
        Py_DECREF(err);
        if (e < 0) return NULL;
        r.error = e;
    } else {
        Py_DECREF(err);
    }
    return PyBool_FromLong(core_push(c, &r));
}

/* reserve(n): make events now until n are free (within the capacity), so no step pays for creation. */
static PyObject *core_reserve(StepCore *c, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    for (;;) {
        pthread_mutex_lock(&c->pool.lock);
        int more = c->pool.nfree < n && c->pool.created < c->pool.cap;
        pthread_mutex_unlock(&c->pool.lock);
        if (!more) break;
        int32_t s = pool_create(c);
        if (s < 0) return NULL;
        pthread_mutex_lock(&c->pool.lock);
        c->pool.free[c->pool.nfree++] = s;
        pthread_mutex_unlock(&c->pool.lock);
    }
    Py_RETURN_NONE;
}

/* close_events(): destroy the free events (the thread has stopped; events still held are left alone). */
static PyObject *core_close_events(StepCore *c, PyObject *Py_UNUSED(ignored)) {
    Pool *p = &c->pool;
    pthread_mutex_lock(&p->lock);
    int n = p->nfree;
    int32_t *slots = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (slots) memcpy(slots, p->free, sizeof(int32_t) * (size_t)n);
    p->nfree = 0;
    p->cap = p->created;  /* no more are made; acquire() finds none free */
    pthread_mutex_unlock(&p->lock);
    if (!slots) return PyErr_NoMemory();
    for (int i = 0; i < n; i++) {
        PyObject *h = PyLong_FromVoidPtr((void *)p->handle[slots[i]]);
        PyObject *r = h ? PyObject_CallOneArg(c->destroy_event, h) : NULL;
        Py_XDECREF(h);
        if (!r) PyErr_Clear();
        Py_XDECREF(r);
    }
    /* the slots are gone: mark them so a late unref cannot put them back */
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < n; i++) atomic_store(&p->refs[slots[i]], 1 << 30);
    pthread_mutex_unlock(&p->lock);
    PyMem_RawFree(slots);
    Py_RETURN_NONE;
}

/* after_fork(drop_events): in a forked child, before anything else uses the core (perfsdk.stepcore's
   PyStepCore.after_fork, the same reset). Only the calling thread exists there: the core's thread is gone,
   and whatever it held at the fork — its mutexes, a half-counted step — is the parent's. The mutexes and
   condition variables are initialised anew (the parent's may be locked by a thread that does not exist
   here), the ring and the pending steps emptied (the parent counts them), every total and counter zeroed.
   drop_events: the parent timed with CUDA events, which a forked child cannot use: the pool hands out no
   more (nothing is destroyed: the handles are the parent's) and no driver function is called again. */
static PyObject *core_after_fork(StepCore *c, PyObject *arg) {
    int drop = PyObject_IsTrue(arg);
    if (drop < 0) return NULL;
    if (pthread_mutex_init(&c->lock, NULL) || pthread_cond_init(&c->done_cond, NULL) ||
        pthread_mutex_init(&c->wake_lock, NULL) || pthread_cond_init(&c->wake_cond, NULL) ||
        pthread_mutex_init(&c->pool.lock, NULL)) {
        PyErr_SetString(PyExc_OSError, "StepCore.after_fork: pthread init failed");
        return NULL;
    }
    c->wake_flag = 0;
    c->started = 0;
    atomic_store(&c->running, 0);
    atomic_store(&c->stop, 0);
    atomic_store(&c->ring.head, 0);
    atomic_store(&c->ring.tail, 0);
    c->pending_head = c->pending_len = 0;
    c->dropped = 0;
    atomic_store(&c->done, 0);
    memset(c->totals, 0, sizeof(c->totals));
    for (int p = 0; p < NPHASES; p++) {  /* the counts, not the buffers */
        Recent *r = &c->recent[p];
        r->steps = r->errors = r->n_seconds = r->n_mbu = r->n_mfu = 0;
    }
    c->nsamples = 0;
    c->sampled = 0;
    c->nfeed = 0;
    c->nvalues = 0;
    c->values_dropped = 0;
    c->errors = 0;
    c->dropped_samples = 0;
    c->nsites = 0;
    if (drop) {
        c->pool.cap = c->pool.nfree = 0;  /* acquire() finds none; a late unref() of a parent's slot is ignored */
        c->query = c->synchronize = NULL;
        c->elapsed = NULL;
        c->ctx_set = NULL;
        c->context = NULL;
        c->exchange_mode = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *get_int64(int64_t v) { return PyLong_FromLongLong(v); }

static PyObject *core_get_pushed(StepCore *c, void *_) { return get_int64((int64_t)atomic_load(&c->ring.head)); }
static PyObject *core_get_done(StepCore *c, void *_) { return get_int64(atomic_load(&c->done)); }
static PyObject *core_get_dropped(StepCore *c, void *_) { return get_int64(c->dropped); }
static PyObject *core_get_capacity(StepCore *c, void *_) { return get_int64((int64_t)c->ring.cap); }
static PyObject *core_get_waiting(StepCore *c, void *_) {
    return get_int64((int64_t)atomic_load(&c->ring.head) - atomic_load(&c->done));
}
static PyObject *core_get_errors(StepCore *c, void *_) {
    pthread_mutex_lock(&c->lock);
    int64_t e = c->errors;
    pthread_mutex_unlock(&c->lock);
    return get_int64(e);
}
static PyObject *core_get_dropped_samples(StepCore *c, void *_) {
    pthread_mutex_lock(&c->lock);
    int64_t n = c->dropped_samples;
    pthread_mutex_unlock(&c->lock);
    return get_int64(n);
}
static PyObject *core_get_events_in_use(StepCore *c, void *_) {
    pthread_mutex_lock(&c->pool.lock);
    int64_t n = c->pool.created - c->pool.nfree;
    pthread_mutex_unlock(&c->pool.lock);
    return get_int64(n);
}
static PyObject *core_get_events_free(StepCore *c, void *_) {
    pthread_mutex_lock(&c->pool.lock);
    int64_t n = c->pool.nfree;
    pthread_mutex_unlock(&c->pool.lock);
    return get_int64(n);
}
static PyObject *core_get_events_created(StepCore *c, void *_) { return get_int64(c->pool.created); }
static PyObject *core_get_feed(StepCore *c, void *_) { return PyBool_FromLong(atomic_load(&c->feed_window)); }
static int core_set_feed(StepCore *c, PyObject *v, void *_) {
    int b = v ? PyObject_IsTrue(v) : 0;
    if (b < 0) return -1;
    atomic_store(&c->feed_window, b);
    return 0;
}
static PyObject *core_get_feed_values(StepCore *c, void *_) { return PyBool_FromLong(atomic_load(&c->feed_values)); }
static int core_set_feed_values(StepCore *c, PyObject *v, void *_) {
    int b = v ? PyObject_IsTrue(v) : 0;
    if (b < 0) return -1;
    atomic_store(&c->feed_values, b);
    return 0;
}
static PyObject *core_get_alive(StepCore *c, void *_) {
    return PyBool_FromLong(c->started && atomic_load(&c->running));
}

static PyMethodDef core_methods[] = {
    {"start", (PyCFunction)core_start, METH_NOARGS, "Start the core's thread."},
    {"stop", (PyCFunction)core_stop, METH_VARARGS, "stop(timeout=None) -> bool: stop the thread (after what is queued)."},
    {"sync", (PyCFunction)core_sync, METH_VARARGS,
     "sync(timeout=None) -> bool: wait (GIL released) until every step pushed before the call is counted."},
    {"pause", (PyCFunction)core_pause, METH_O, "pause(flag): stop reading records, or carry on (tests)."},
    {"take", (PyCFunction)core_take, METH_NOARGS, "take() -> StepTotals: everything counted since the last take."},
    {"recent", (PyCFunction)core_recent, METH_O, "recent(phase) -> RecentSteps: the phase's last steps."},
    {"take_errors", (PyCFunction)core_take_errors, METH_NOARGS, "take_errors() -> [(site, message)]."},
    {"push", (PyCFunction)core_push_py, METH_O, "push(StepRecord) -> bool: queue a step with no events."},
    {"close_events", (PyCFunction)core_close_events, METH_NOARGS, "Destroy the free events (after stop)."},
    {"reserve", (PyCFunction)core_reserve, METH_O, "reserve(n): make events until n are free (benchmarks)."},
    {"after_fork", (PyCFunction)core_after_fork, METH_O,
     "after_fork(drop_events): a new core in place, in a forked child (its thread is not there)."},
    {NULL}};

static PyGetSetDef core_getset[] = {
    {"pushed", (getter)core_get_pushed, NULL, "records accepted", NULL},
    {"done", (getter)core_get_done, NULL, "records fully counted", NULL},
    {"dropped", (getter)core_get_dropped, NULL, "records refused: the queue was full", NULL},
    {"capacity", (getter)core_get_capacity, NULL, "records that may wait", NULL},
    {"waiting", (getter)core_get_waiting, NULL, "records pushed and not yet counted", NULL},
    {"errors", (getter)core_get_errors, NULL, "CUDA errors reading events, and negative durations refused", NULL},
    {"dropped_samples", (getter)core_get_dropped_samples, NULL,
     "sampled steps beyond the cap between two takes (spans never built)", NULL},
    {"events_in_use", (getter)core_get_events_in_use, NULL, "events held by a step or a thread", NULL},
    {"events_free", (getter)core_get_events_free, NULL, "events on the free stack", NULL},
    {"events_created", (getter)core_get_events_created, NULL, "events made so far", NULL},
    {"feed_window", (getter)core_get_feed, (setter)core_set_feed, "keep every decode step for a profiler window",
     NULL},
    {"feed_values", (getter)core_get_feed_values, (setter)core_set_feed_values,
     "keep every timed step's (phase, seconds, mbu, mfu) for an OpenTelemetry metrics sink", NULL},
    {"alive", (getter)core_get_alive, NULL, "the thread runs", NULL},
    {NULL}};

PyTypeObject StepCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "perfsdk._native.StepCore",
    .tp_doc = "The step core in C (perfsdk.stepcore.PyStepCore's algorithm, on a thread without the GIL).",
    .tp_basicsize = sizeof(StepCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = core_new,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
    .tp_getset = core_getset,
};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1

int init_stepcore(PyObject *module) {
    INTERN(str_phase, "phase");
    INTERN(str_timing, "timing");
    INTERN(str_t0, "t0");
    INTERN(str_t1, "t1");
    INTERN(str_start, "start");
    INTERN(str_end, "end");
    INTERN(str_batch, "batch");
    INTERN(str_tokens, "tokens");
    INTERN(str_context_tokens, "context_tokens");
    INTERN(str_lens_sum, "lens_sum");
    INTERN(str_lens_sq, "lens_sq");
    INTERN(str_lens_count, "lens_count");
    INTERN(str_error, "error");
    if (PyType_Ready(&StepCoreType) < 0) return -1;
    return PyModule_AddObjectRef(module, "StepCore", (PyObject *)&StepCoreType);
}
