/* perfsdk._native: the hot path (hotpath.c), the step core (stepcore.c) and their named hand-off (records.c) in C.
 *
 * An optional extension: where it cannot be built perfsdk runs the same algorithms in Python
 * (perfsdk.hotpath, perfsdk.stepcore), and Monitor.hot_path says which runs. The module needs the GIL:
 * ring pushes are serialised by it (see native.h), so it does not declare free-threading support.
 */
#include "native.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "perfsdk._native",
    "The hot path and the step core in C (see perfsdk/csrc/; perfsdk.hotpath and perfsdk.stepcore are the "
    "Python references).",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (init_records(m) < 0 || init_stepcore(m) < 0 || init_hotpath(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
