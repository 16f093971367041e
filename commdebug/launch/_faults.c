/* commdebug.launch._faults: the record of a fatal signal (SIGSEGV, SIGFPE, SIGABRT, SIGBUS,
 * SIGILL), written beside a rank's dump by the process that dies of it.
 *
 * The standard library's faulthandler writes the Python stacks of a dying process, but to one
 * file only, and a program that enables it after us (torch's elastic @record, torchtitan's
 * trainer: both to stderr) takes that file over. This handler is a second one, in a chain:
 * it writes its record, puts back the action it found when it was installed, and raises the
 * signal again, so whatever was there (faulthandler writing to stderr, or the default action)
 * runs as it would have without us and the process dies of the same signal. A faulthandler
 * enabled after us finds this handler installed and calls it after writing its own output;
 * one enabled before us is what this handler calls. The record file is created only when a
 * signal arrives: a process that ends otherwise leaves nothing.
 *
 * The record: the header given to arm() (rank, pid, run id, main thread: see faults.py), then
 * "signal: N" and "thread: 0x..." (the thread the signal was delivered to), a blank line, and
 * every thread's Python stack as the interpreter's own dumper writes it (faulthandler's format).
 *
 * The dumper is internal API (internal/pycore_traceback.h), which CPython 3.11 and 3.12 export
 * (3.13 no longer does; 3.10's was not found at load time when tried); other versions get a
 * module without arm(), and the Python side records nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define Py_BUILD_CORE
#include "internal/pycore_traceback.h"
#undef Py_BUILD_CORE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const int fatal_signals[] = {SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL};
#define ALT_STACK_SIZE (256 * 1024)  /* the handler's stack after an overflow: the stack dumper's frames and buffers */
#define N_SIGNALS ((int)(sizeof(fatal_signals) / sizeof(fatal_signals[0])))

static struct sigaction previous[N_SIGNALS];  /* what was installed before us, put back on a signal */
static int installed = 0;
/* replaced whole by arm(); the old strings are never freed (a handler may be reading them) */
static char *volatile record_path = NULL;
static char *volatile record_head = NULL;
static volatile sig_atomic_t writing = 0;
static PyInterpreterState *interpreter = NULL;

static void
write_all(int fd, const char *text, size_t n)
{
    while (n > 0) {
        ssize_t done = write(fd, text, n);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        text += done;
        n -= (size_t)done;
    }
}

/* "0x" and 16 hex digits, as the interpreter's dumper writes a thread id on 64-bit Linux */
static void
write_hex(int fd, unsigned long value)
{
    char text[2 + 2 * sizeof(unsigned long) + 1];
    int width = 2 * (int)sizeof(unsigned long);
    text[0] = '0';
    text[1] = 'x';
    for (int i = width - 1; i >= 0; i--) {
        text[2 + i] = "0123456789abcdef"[value & 0xf];
        value >>= 4;
    }
    text[2 + width] = '\n';
    write_all(fd, text, sizeof(text));
}

static void
write_int(int fd, int value)
{
    char text[16];
    int i = (int)sizeof(text);
    text[--i] = '\n';
    do {
        text[--i] = (char)('0' + value % 10);
        value /= 10;
    } while (value > 0 && i > 0);
    write_all(fd, text + i, sizeof(text) - (size_t)i);
}

static void
on_fatal_signal(int signum)
{
    int saved_errno = errno;
    int index = 0;
    while (index < N_SIGNALS && fatal_signals[index] != signum)
        index++;
    if (!writing) {  /* a second fault while writing: no second record, straight to the chain */
        writing = 1;
        const char *path = record_path, *head = record_head;
        int fd = path != NULL ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
        if (fd >= 0) {
            if (head != NULL)
                write_all(fd, head, strlen(head));
            write_all(fd, "signal: ", 8);
            write_int(fd, signum);
            write_all(fd, "thread: ", 8);
            write_hex(fd, (unsigned long)pthread_self());
            write_all(fd, "\n", 1);
            /* the thread's own state, read from thread-local storage: the one holding the GIL
             * may be another (the signal came in a thread that released it, or has none) */
            (void)_Py_DumpTracebackThreads(fd, interpreter, PyGILState_GetThisThreadState());
            close(fd);
        }
    }
    if (index < N_SIGNALS)
        sigaction(signum, &previous[index], NULL);
    errno = saved_errno;
    raise(signum);  /* SA_NODEFER: delivered now, to what was there before us */
}

PyDoc_STRVAR(arm_doc,
"arm(path, header) -> None\n\n"
"On a fatal signal, write `header` (str), the signal, and every thread's Python stack to the\n"
"file `path` (created then), then let the signal do what it did before. The first call\n"
"installs the handler; later calls change the file and the header.");

static PyObject *
arm(PyObject *module, PyObject *args)
{
    const char *path, *head;
    if (!PyArg_ParseTuple(args, "ss:arm", &path, &head))
        return NULL;
    char *new_path = strdup(path), *new_head = strdup(head);
    if (new_path == NULL || new_head == NULL) {
        free(new_path);
        free(new_head);
        return PyErr_NoMemory();
    }
    record_head = new_head;  /* the old ones leak: a few bytes per rename, never freed under a handler */
    record_path = new_path;
    if (!installed) {
        interpreter = PyInterpreterState_Get();
        /* A stack overflow leaves the overflowing thread no stack to run a handler on: without an
           alternate stack the kernel kills the process and nothing is written. The arming thread
           (the main thread, where deep recursion usually is) gets one unless it has one already
           (faulthandler's); it is never freed, as a handler may be running on it. */
        stack_t current;
        if (sigaltstack(NULL, &current) == 0 && (current.ss_flags & SS_DISABLE)) {
            stack_t mine;
            memset(&mine, 0, sizeof(mine));
            mine.ss_size = ALT_STACK_SIZE;
            mine.ss_sp = malloc(mine.ss_size);
            if (mine.ss_sp != NULL && sigaltstack(&mine, NULL) != 0)
                free(mine.ss_sp);
        }
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_handler = on_fatal_signal;
        sigemptyset(&action.sa_mask);
        /* SA_ONSTACK: on a thread's alternate stack where it has one (a stack overflow) */
        action.sa_flags = SA_NODEFER | SA_ONSTACK;
        for (int i = 0; i < N_SIGNALS; i++) {
            if (sigaction(fatal_signals[i], &action, &previous[i]) != 0) {
                for (int j = 0; j < i; j++)
                    sigaction(fatal_signals[j], &previous[j], NULL);
                return PyErr_SetFromErrno(PyExc_OSError);
            }
        }
        installed = 1;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"arm", arm, METH_VARARGS, arm_doc},
    {NULL, NULL, 0, NULL},
};
#else
static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};
#endif

static struct PyModuleDef faults_module = {
    PyModuleDef_HEAD_INIT, "_faults", "A record of the fatal signal that ends the process.", -1, methods,
};

PyMODINIT_FUNC
PyInit__faults(void)
{
    return PyModule_Create(&faults_module);
}
