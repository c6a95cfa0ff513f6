/* perfsdk._native's named hand-off: the struct sequences the step core returns, and the shared constants.
 *
 * Each type is the C twin of the perfsdk/records.py type of the same name: the same field names in the same
 * order (tests/test_stepcore.py compares each pair, so a field added, removed or moved on one side only
 * fails there), and perfsdk.stepcore hands each on as the records.py type. The constants are the ones both
 * languages use (the phase and timing codes, the sizes a record may carry); tests/test_native.py checks them
 * equal to records.py's. The capacities of the core's buffers are not here: perfsdk.records defines them and
 * the core is given them when it is built.
 */
#include "native.h"

PyTypeObject PhaseTotalsType, StepSampleType, WindowFeedEntryType, ValueFeedEntryType, StepTotalsType,
    RecentStepsType;

static PyStructSequence_Field phase_totals_fields[] = {
    {"steps", "steps counted"},
    {"errors", "steps that raised (the user's exception)"},
    {"step_counts", "timed steps per step-time bucket, then +Inf"},
    {"step_sum", "their seconds"},
    {"mbu_counts", "steps per MBU bucket, then +Inf"},
    {"mbu_sum", "their MBUs"},
    {"mfu_counts", "steps per MFU bucket, then +Inf"},
    {"mfu_sum", "their MFUs"},
    {"bytes", "bytes of timed steps"},
    {"flops", "FLOPs of timed steps"},
    {"tokens", "tokens of every step"},
    {NULL, NULL}};

static PyStructSequence_Field step_sample_fields[] = {
    {"phase", "phase code"},
    {"t0", "host clock at entry (ns)"},
    {"t1", "host clock at exit (ns)"},
    {"seconds", "device or host seconds, or None"},
    {"batch", "sequences"},
    {"tokens", "tokens"},
    {"mbu", "MBU or None"},
    {"mfu", "MFU or None"},
    {"error", "the user's exception type, or None"},
    {NULL, NULL}};

static PyStructSequence_Field window_feed_entry_fields[] = {
    {"seconds", "a timed decode step's seconds"},
    {"batch", "its sequences"},
    {"mbu", "its MBU or None"},
    {NULL, NULL}};

static PyStructSequence_Field value_feed_entry_fields[] = {
    {"phase", "phase code"},
    {"seconds", "a timed step's seconds"},
    {"mbu", "its MBU or None"},
    {"mfu", "its MFU or None"},
    {NULL, NULL}};

static PyStructSequence_Field step_totals_fields[] = {
    {"phases", "a PhaseTotals per phase"},
    {"samples", "sampled steps (StepSample)"},
    {"window_feed", "timed decode steps while a profiler window listens (WindowFeedEntry)"},
    {"value_feed", "timed steps while an OpenTelemetry metrics sink listens (ValueFeedEntry)"},
    {"value_feed_dropped", "timed steps beyond the value feed's capacity"},
    {NULL, NULL}};

static PyStructSequence_Field recent_steps_fields[] = {
    {"steps", "every step ever counted"},
    {"errors", "steps that raised"},
    {"seconds", "the last timed steps' seconds"},
    {"mbu", "their MBUs"},
    {"mfu", "their MFUs"},
    {NULL, NULL}};

#define DESC(var, name, doc, fields, n) \
    static PyStructSequence_Desc var = {"perfsdk._native." name, doc, fields, n}

DESC(phase_totals_desc, "PhaseTotals", "What one phase's steps added since the previous take.", phase_totals_fields,
     11);
DESC(step_sample_desc, "StepSample", "One sampled step, for a span.", step_sample_fields, 9);
DESC(window_feed_entry_desc, "WindowFeedEntry", "A timed decode step, for a profiler window.",
     window_feed_entry_fields, 3);
DESC(value_feed_entry_desc, "ValueFeedEntry", "A timed step's values, for an OpenTelemetry metrics sink.",
     value_feed_entry_fields, 4);
DESC(step_totals_desc, "StepTotals", "Everything StepCore.take() hands over.", step_totals_fields, 5);
DESC(recent_steps_desc, "RecentSteps", "One phase's last steps, for Monitor.stats().", recent_steps_fields, 5);

static int add_type(PyObject *module, PyTypeObject *type, PyStructSequence_Desc *desc, const char *name) {
    if (PyStructSequence_InitType2(type, desc) < 0) return -1;
    return PyModule_AddObjectRef(module, name, (PyObject *)type);
}

int init_records(PyObject *module) {
    if (add_type(module, &PhaseTotalsType, &phase_totals_desc, "PhaseTotals") < 0 ||
        add_type(module, &StepSampleType, &step_sample_desc, "StepSample") < 0 ||
        add_type(module, &WindowFeedEntryType, &window_feed_entry_desc, "WindowFeedEntry") < 0 ||
        add_type(module, &ValueFeedEntryType, &value_feed_entry_desc, "ValueFeedEntry") < 0 ||
        add_type(module, &StepTotalsType, &step_totals_desc, "StepTotals") < 0 ||
        add_type(module, &RecentStepsType, &recent_steps_desc, "RecentSteps") < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "PREFILL", PHASE_PREFILL) < 0 ||
        PyModule_AddIntConstant(module, "DECODE", PHASE_DECODE) < 0 ||
        PyModule_AddIntConstant(module, "MIXED", PHASE_MIXED) < 0 ||
        PyModule_AddIntConstant(module, "TIMED", TIMING_TIMED) < 0 ||
        PyModule_AddIntConstant(module, "HOST", TIMING_HOST) < 0 ||
        PyModule_AddIntConstant(module, "UNTIMED", TIMING_UNTIMED) < 0 ||
        PyModule_AddIntConstant(module, "NO_TOKENS", NO_TOKENS) < 0 ||
        PyModule_AddIntConstant(module, "UNSIZED", UNSIZED) < 0 ||
        PyModule_AddIntConstant(module, "MAX_STEP_BOUNDS", NSTEP_MAX) < 0 ||
        PyModule_AddIntConstant(module, "MAX_UTIL_BOUNDS", NUTIL_MAX) < 0)
        return -1;
    PyObject *lens_sq_max = PyLong_FromLongLong(LENS_SQ_MAX);
    if (!lens_sq_max) return -1;
    int rc = PyModule_AddObjectRef(module, "LENS_SQ_MAX", lens_sq_max);
    Py_DECREF(lens_sq_max);
    return rc;
}
