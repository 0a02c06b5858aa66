/* Time Stamp Counter reads for hvbench.
 *
 * now_ns() turns one RDTSCP into nanoseconds with a fixed-point multiplier set by
 * set_calibration(), so producer and consumer stamps cost one instruction plus a multiply.
 * RDTSCP waits for earlier instructions to finish, so a stamp is not taken early.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cpuid.h>
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>

#define SHIFT 32

static uint64_t base_ticks;
static int64_t base_ns;
static uint64_t mult; /* nanoseconds per tick, scaled by 2^SHIFT */
static int calibrated;

static inline uint64_t read_tsc(void)
{
    unsigned int aux;
    return __rdtscp(&aux);
}

static inline int64_t raw_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *ticks(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(read_tsc());
}

static PyObject *ticks_lfence(PyObject *self, PyObject *unused)
{
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    return PyLong_FromUnsignedLongLong(t);
}

static PyObject *ticks_cpu(PyObject *self, PyObject *unused)
{
    unsigned int aux;
    uint64_t t = __rdtscp(&aux);
    return Py_BuildValue("(KI)", (unsigned long long)t, aux & 0xfff); /* Linux: cpu in low 12 bits */
}

static PyObject *now_ns(PyObject *self, PyObject *unused)
{
    if (!calibrated) {
        PyErr_SetString(PyExc_RuntimeError, "TSC clock is not calibrated: call tsc_timer.calibrate()");
        return NULL;
    }
    uint64_t delta = read_tsc() - base_ticks;
    int64_t ns = base_ns + (int64_t)(((unsigned __int128)delta * mult) >> SHIFT);
    return PyLong_FromLongLong(ns);
}

/* One TSC read bracketed by two CLOCK_MONOTONIC_RAW reads: (ticks, raw midpoint ns, width ns). */
static PyObject *paired_sample(PyObject *self, PyObject *unused)
{
    int64_t before = raw_ns();
    uint64_t t = read_tsc();
    int64_t after = raw_ns();
    return Py_BuildValue("(KLL)", (unsigned long long)t, (long long)(before + (after - before) / 2),
                         (long long)(after - before));
}

static PyObject *set_calibration(PyObject *self, PyObject *args)
{
    double hz;
    unsigned long long ticks0;
    long long ns0;
    if (!PyArg_ParseTuple(args, "dKL", &hz, &ticks0, &ns0))
        return NULL;
    if (!(hz > 1e6 && hz < 1e11)) {
        PyErr_Format(PyExc_ValueError, "implausible TSC frequency %g Hz", hz);
        return NULL;
    }
    mult = (uint64_t)(1e9 / hz * (double)(1ULL << SHIFT) + 0.5);
    base_ticks = ticks0;
    base_ns = ns0;
    calibrated = 1;
    Py_RETURN_NONE;
}

/* TSC frequency from CPUID leaf 0x15 (crystal clock × ratio), 0 where the CPU does not say. */
static PyObject *cpuid_tsc_hz(PyObject *self, PyObject *unused)
{
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, NULL) < 0x15 || !__get_cpuid(0x15, &eax, &ebx, &ecx, &edx) || !eax ||
        !ebx || !ecx)
        return PyLong_FromLong(0);
    return PyLong_FromUnsignedLongLong((unsigned long long)ecx * ebx / eax);
}

static PyMethodDef methods[] = {
    {"ticks", ticks, METH_NOARGS, "RDTSCP: raw TSC ticks."},
    {"ticks_lfence", ticks_lfence, METH_NOARGS, "LFENCE; RDTSC; LFENCE: raw TSC ticks."},
    {"ticks_cpu", ticks_cpu, METH_NOARGS, "RDTSCP: (ticks, cpu number)."},
    {"now_ns", now_ns, METH_NOARGS, "TSC time in nanoseconds on the calibrated timeline."},
    {"paired_sample", paired_sample, METH_NOARGS,
     "(ticks, CLOCK_MONOTONIC_RAW midpoint ns, bracket width ns)."},
    {"set_calibration", set_calibration, METH_VARARGS,
     "set_calibration(hz, base_ticks, base_ns): base_ticks maps to base_ns."},
    {"cpuid_tsc_hz", cpuid_tsc_hz, METH_NOARGS, "TSC Hz from CPUID 0x15, or 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tsc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tsc(void)
{
    return PyModule_Create(&module);
}
