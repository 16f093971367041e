/* commdebug.capture._frames: find the first frame of a stack that is not library code, without
 * making frame objects.
 *
 * Every collective's source line is the first frame of the user's code above it, some twenty
 * library frames up. Walking there by frame.f_back makes a frame object of each interpreter
 * frame on the way (CPython 3.11 makes them lazily), which the interpreter must then free or
 * take over when each frame returns. Reading the interpreter's own frame records costs a
 * pointer per frame. The Python side (source.py beside this file) classifies what this
 * returns and falls back to frame objects where this module is not built.
 *
 * Only CPython 3.11's frame layout is read (internal/pycore_frame.h, compiled against the
 * running interpreter); other versions get a module without first_other, and the fallback.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define Py_BUILD_CORE
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE

PyDoc_STRVAR(first_other_doc,
"first_other(depth, files) -> (code, instruction, depth) | None\n\n"
"The first frame, from `depth` levels above the calling Python function (the frame\n"
"sys._getframe(depth) returns there) up, whose code's file name is not in the set `files`:\n"
"its code object, its instruction offset in bytes (frame.f_lasti) and its depth. None when\n"
"every frame up to the bottom of the stack is in `files`.");

static PyObject *
first_other(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyAnySet_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "first_other(depth: int, files: set)");
        return NULL;
    }
    long depth = PyLong_AsLong(args[0]);
    if (depth == -1 && PyErr_Occurred())
        return NULL;
    PyObject *files = args[1];
    long d = 0;
    /* a C function pushes no interpreter frame: the current one is the caller's */
    for (_PyInterpreterFrame *frame = PyThreadState_Get()->cframe->current_frame; frame != NULL;
         frame = frame->previous) {
        if (_PyFrame_IsIncomplete(frame))  /* not started yet: sys._getframe skips these too */
            continue;
        if (d >= depth) {
            int in_files = PySet_Contains(files, frame->f_code->co_filename);
            if (in_files < 0)
                return NULL;
            if (!in_files)
                return Py_BuildValue("(Oil)", (PyObject *)frame->f_code,
                                     _PyInterpreterFrame_LASTI(frame) * (int)sizeof(_Py_CODEUNIT), d);
        }
        d++;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"first_other", (PyCFunction)(void (*)(void))first_other, METH_FASTCALL, first_other_doc},
    {NULL, NULL, 0, NULL},
};
#else
static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};
#endif

static struct PyModuleDef frames_module = {
    PyModuleDef_HEAD_INIT, "_frames", "Frames of the interpreter's stack, read without frame objects.", -1, methods,
};

PyMODINIT_FUNC
PyInit__frames(void)
{
    return PyModule_Create(&frames_module);
}
