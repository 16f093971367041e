/* _kineto_json.h: JSON for commdebug.formats._kineto (_kineto.c includes it): a skip over any
 * value that checks it is strict JSON without making objects, and the Python objects json.loads
 * makes of a value already checked.
 *
 * The input ends with a NUL byte (a bytes object's buffer does): a NUL is never valid where these
 * functions read (outside a string it is no JSON, inside one a control character), so the loops
 * stop on it without comparing with the end at every byte.
 */
#ifndef COMMDEBUG_KINETO_JSON_H
#define COMMDEBUG_KINETO_JSON_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
#define SIXTEEN_AT_ONCE 1
#endif

#define MAX_DEPTH 200
#define STRINGS 4096  /* slots of the cache of strs (build_string) */

typedef const unsigned char *Ptr;

/* ---- a validating skip over JSON ------------------------------------------------------ */

/* bytes of a string that need a look: 1 quote, 2 backslash, 3 control (NUL included), 4 not ASCII */
static unsigned char STR_CLASS[256];
static unsigned char IS_WS[256];

static void
init_tables(void)
{
    for (int i = 0; i < 256; i++)
        STR_CLASS[i] = i < 0x20 ? 3 : i >= 0x80 ? 4 : 0;
    STR_CLASS['"'] = 1;
    STR_CLASS['\\'] = 2;
    IS_WS[' '] = IS_WS['\n'] = IS_WS['\r'] = IS_WS['\t'] = 1;
}

static inline Ptr
skip_ws(Ptr p)
{
    while (IS_WS[*p])
        p++;
    return p;
}

static inline int
is_digit(unsigned char c)
{
    return (unsigned char)(c - '0') < 10;
}

static inline int
is_hex(unsigned char c)
{
    return is_digit(c) || (unsigned char)((c | 0x20) - 'a') < 6;
}

/* The length of the UTF-8 sequence at p, or 0 when it is not one. Encoded surrogates pass: the
 * standard library's json decodes bytes with "surrogatepass", so the full parse reads them. */
static int
utf8_length(Ptr p, Ptr end)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;
    int n;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
    }
    else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    }
    else
        return 0;
    if (end - p < n || p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* The first byte at or after p that a string needs a look at (STR_CLASS): the NUL at the end
 * at the latest. */
static inline Ptr
next_special(Ptr p, Ptr end)
{
#ifdef SIXTEEN_AT_ONCE
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        /* signed compare: below 0x20 (control) and 0x80 and above (not ASCII) both read as less */
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)), _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(hit);
        if (mask)
            return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#else
    (void)end;
#endif
    while (STR_CLASS[*p] == 0)
        p++;
    return p;
}

/* A string at p (its opening quote): the position after its closing quote, or NULL when it is
 * not a JSON string. *escaped is set when it holds an escape. */
static Ptr
skip_string(Ptr p, Ptr end, int *escaped)
{
    p++;
    for (;;) {
        p = next_special(p, end);
        switch (STR_CLASS[*p]) {
        case 1:
            return p + 1;
        case 2:
            *escaped = 1;
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                break;
            case 'u':
                if (!is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]) || !is_hex(p[5]))
                    return NULL;
                p += 6;
                break;
            default:
                return NULL;
            }
            break;
        case 3:
            return NULL;
        default: {
            int n = utf8_length(p, end);
            if (n == 0)
                return NULL;
            p += n;
        }
        }
    }
}

/* A number at p: the position after it, or NULL. *integer: no fraction, no exponent. */
static Ptr
skip_number(Ptr p, int *integer)
{
    *integer = 1;
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (is_digit(*p) && *p != '0')
        while (is_digit(*p))
            p++;
    else
        return NULL;
    if (*p == '.') {
        *integer = 0;
        if (!is_digit(*++p))
            return NULL;
        while (is_digit(*p))
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        *integer = 0;
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!is_digit(*p))
            return NULL;
        while (is_digit(*p))
            p++;
    }
    return p;
}

/* An object or an array at p (its '{' or '['), each member or element handed to `visit`, which
 * reads or skips the value (an element's key is NULL): the position after it, or NULL. */
typedef Ptr (*Visit)(Ptr key, Py_ssize_t len, int escaped, Ptr value, Ptr end, int depth, void *into);

static Ptr skip_value(Ptr p, Ptr end, int depth);

static inline Ptr
read_container(Ptr p, Ptr end, int depth, Visit visit, void *into)
{
    unsigned char close = *p == '{' ? '}' : ']';
    if (depth > MAX_DEPTH)
        return NULL;
    p = skip_ws(p + 1);
    if (*p == close)
        return p + 1;
    for (;;) {
        int escaped = 0;
        Ptr key = NULL, after = NULL;
        if (close == '}') {
            key = p + 1;
            if (*p != '"' || (after = skip_string(p, end, &escaped)) == NULL)
                return NULL;
            p = skip_ws(after);
            if (*p != ':')
                return NULL;
            p = skip_ws(p + 1);
        }
        if ((p = visit(key, key != NULL ? after - key - 1 : 0, escaped, p, end, depth + 1, into)) == NULL)
            return NULL;
        p = skip_ws(p);
        if (*p == close)
            return p + 1;
        if (*p != ',')
            return NULL;
        p = skip_ws(p + 1);
    }
}

static Ptr
skip_member(Ptr key, Py_ssize_t len, int escaped, Ptr p, Ptr end, int depth, void *into)
{
    (void)key, (void)len, (void)escaped, (void)into;
    return skip_value(p, end, depth);
}

/* Any JSON value at p: the position after it, or NULL. */
static Ptr
skip_value(Ptr p, Ptr end, int depth)
{
    int flag = 0;
    switch (*p) {
    case '"':
        return skip_string(p, end, &flag);
    case '{': case '[':
        return read_container(p, end, depth, skip_member, NULL);
    case 't':
        return end - p >= 4 && memcmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f':
        return end - p >= 5 && memcmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n':
        return end - p >= 4 && memcmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default:
        return skip_number(p, &flag);
    }
}

/* ---- numbers ------------------------------------------------------------------------------ */

/* An integer's text (checked) as a Python int, or NULL (no error set) where it does not fit in
 * 64 bits: orjson reads such an integer as a float, json as an int, and the caller leaves it to
 * the full parse, whichever that is. */
static PyObject *
integer_of(Ptr p, Py_ssize_t len)
{
    Ptr end = p + len;
    int negative = *p == '-';
    uint64_t value = 0;
    for (p += negative; p < end; p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return NULL;
        value = value * 10 + digit;
    }
    if (!negative)
        return PyLong_FromUnsignedLongLong(value);
    if (value > (uint64_t)INT64_MAX + 1)
        return NULL;
    return PyLong_FromLongLong(value == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(long long)value);
}

static const double POWERS_OF_TEN[] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* A number's text (checked) as float() reads it, correctly rounded: where its digits make an
 * integer below 2**53 and its decimal exponent is at most 22, one exact division or
 * multiplication by an exact power of ten (the IEEE operation rounds once); else the standard
 * library's conversion. -1 with an error set, else 0. */
static int
double_of(Ptr p, Py_ssize_t len, double *out)
{
    Ptr end = p + len;
    int negative = *p == '-', digits = 0, exponent = 0, fraction = 0;
    uint64_t mantissa = 0;
    char small[64], *text = small;
    for (p += negative; p < end && *p != 'e' && *p != 'E'; p++) {
        if (*p == '.') {
            fraction = 1;
            continue;
        }
        if (++digits > 19)
            break;
        mantissa = mantissa * 10 + (uint64_t)(*p - '0');
        exponent -= fraction;
    }
    if (digits <= 19 && p < end) {  /* an exponent */
        int sign = p[1] == '-' ? -1 : 1, value = 0;
        for (p += 1 + (p[1] == '-' || p[1] == '+'); p < end && value < 1000; p++)
            value = value * 10 + (*p - '0');
        exponent = p < end ? 1000 : exponent + sign * value;
    }
    if (digits <= 19 && mantissa <= (1ULL << 53) && exponent >= -22 && exponent <= 22) {
        double value = (double)mantissa;
        value = exponent < 0 ? value / POWERS_OF_TEN[-exponent] : value * POWERS_OF_TEN[exponent];
        *out = negative ? -value : value;
        return 0;
    }
    p = end - len;
    if (len >= (Py_ssize_t)sizeof small && (text = PyMem_Malloc((size_t)len + 1)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(text, p, (size_t)len);
    text[len] = 0;
    *out = PyOS_string_to_double(text, NULL, NULL);
    if (text != small)
        PyMem_Free(text);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* ---- Python objects of a checked value ------------------------------------------------
 * The same objects json.loads makes of it. */

static Ptr build_value(PyObject **strings, Ptr p, Ptr end, PyObject **out);

/* The code point of a UTF-8 sequence at p (checked), into *cp: its length. */
static int
utf8_point(Ptr p, Py_UCS4 *cp)
{
    if (p[0] < 0xE0) {
        *cp = ((Py_UCS4)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
        return 2;
    }
    if (p[0] < 0xF0) {
        *cp = ((Py_UCS4)(p[0] & 0x0F) << 12) | ((Py_UCS4)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
        return 3;
    }
    *cp = ((Py_UCS4)(p[0] & 0x07) << 18) | ((Py_UCS4)(p[1] & 0x3F) << 12) | ((Py_UCS4)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return 4;
}

static Py_UCS4
hex4(Ptr p)
{
    Py_UCS4 v = 0;
    for (int i = 0; i < 4; i++)
        v = (v << 4) | (Py_UCS4)(is_digit(p[i]) ? p[i] - '0' : (p[i] | 0x20) - 'a' + 10);
    return v;
}

/* A string with escapes, [p, end) its content: a \ud800-\udbff escape followed by a
 * \udc00-\udfff one is one character, as json reads it; a lone one stays a surrogate. */
static PyObject *
unescape(Ptr p, Ptr end)
{
    Py_UCS4 *text = PyMem_Malloc(sizeof(Py_UCS4) * (size_t)(end - p + 1)), *t = text;
    if (text == NULL)
        return PyErr_NoMemory();
    while (p < end) {
        if (*p >= 0x80)
            p += utf8_point(p, t++);
        else if (*p != '\\')
            *t++ = *p++;
        else if (p[1] != 'u') {
            switch (p[1]) {
            case 'b': *t++ = '\b'; break;
            case 'f': *t++ = '\f'; break;
            case 'n': *t++ = '\n'; break;
            case 'r': *t++ = '\r'; break;
            case 't': *t++ = '\t'; break;
            default: *t++ = p[1];
            }
            p += 2;
        }
        else {
            Py_UCS4 cp = hex4(p + 2);
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                Py_UCS4 low = hex4(p + 2);
                if (low >= 0xDC00 && low <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                    p += 6;
                }
            }
            *t++ = cp;
        }
    }
    PyObject *out = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, text, t - text);
    PyMem_Free(text);
    return out;
}

/* A cheap hash of a text: its length and its first and last eight bytes (a trace's strings
 * that share all three are rare; a clash only costs a str made anew). */
static inline size_t
text_slot(Ptr p, Py_ssize_t len)
{
    uint64_t a = 0, b = 0;
    if (len >= 8) {
        memcpy(&a, p, 8);
        memcpy(&b, p + len - 8, 8);
    }
    else
        for (Py_ssize_t i = 0; i < len; i++)
            a = a << 8 | p[i];
    uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + (uint64_t)len) * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h >> 40) % STRINGS;
}

/* A string at p (its opening quote, checked) as a str; an ASCII one without escapes from the
 * cache where the same text was made before. */
static Ptr
build_string(PyObject **strings, Ptr p, Ptr end, PyObject **out)
{
    Ptr from = p + 1, q = from;
    int escaped = 0, ascii = 1;
    for (;;) {
        q = next_special(q, end);
        if (*q == '"')
            break;
        if (*q == '\\') {
            escaped = 1;
            q += q[1] == 'u' ? 6 : 2;
        }
        else {
            ascii = 0;
            q++;
        }
    }
    Py_ssize_t len = q - from;
    if (escaped)
        *out = unescape(from, q);
    else if (!ascii)
        *out = PyUnicode_DecodeUTF8((const char *)from, len, "surrogatepass");  /* as json decodes bytes */
    else {
        PyObject **slot = &strings[text_slot(from, len)];
        if (*slot != NULL && PyUnicode_GET_LENGTH(*slot) == len && memcmp(PyUnicode_DATA(*slot), from, (size_t)len) == 0) {
            *out = Py_NewRef(*slot);
            return q + 1;
        }
        if ((*out = PyUnicode_New(len, 127)) == NULL)
            return NULL;
        memcpy(PyUnicode_DATA(*out), from, (size_t)len);
        Py_XSETREF(*slot, Py_NewRef(*out));
    }
    return *out != NULL ? q + 1 : NULL;
}

/* A number at p (checked): an int, or a float as float() reads its text. */
static Ptr
build_number(Ptr p, PyObject **out)
{
    int integer;
    Ptr after = skip_number(p, &integer);
    Py_ssize_t len = after - p;
    if (integer)
        *out = integer_of(p, len);  /* NULL with no error: past 64 bits, for the full parse */
    else {
        double value;
        *out = double_of(p, len, &value) < 0 ? NULL : PyFloat_FromDouble(value);
    }
    return *out != NULL ? after : NULL;
}

static Ptr
build_value(PyObject **strings, Ptr p, Ptr end, PyObject **out)
{
    *out = NULL;
    switch (*p) {
    case '"':
        return build_string(strings, p, end, out);
    case '{': {
        PyObject *dict = *out = PyDict_New();
        if (dict == NULL)
            return NULL;
        p = skip_ws(p + 1);
        while (*p != '}') {
            PyObject *key, *value;
            if ((p = build_string(strings, p, end, &key)) == NULL)
                return NULL;
            p = build_value(strings, skip_ws(skip_ws(p) + 1), end, &value);
            if (p == NULL || PyDict_SetItem(dict, key, value) < 0) {
                Py_DECREF(key);
                Py_XDECREF(value);
                return NULL;
            }
            Py_DECREF(key);
            Py_DECREF(value);
            p = skip_ws(p);
            p = *p == ',' ? skip_ws(p + 1) : p;
        }
        return p + 1;
    }
    case '[': {
        PyObject *list = *out = PyList_New(0);
        if (list == NULL)
            return NULL;
        p = skip_ws(p + 1);
        while (*p != ']') {
            PyObject *item;
            if ((p = build_value(strings, p, end, &item)) == NULL || PyList_Append(list, item) < 0) {
                Py_XDECREF(item);
                return NULL;
            }
            Py_DECREF(item);
            p = skip_ws(p);
            p = *p == ',' ? skip_ws(p + 1) : p;
        }
        return p + 1;
    }
    case 't':
        *out = Py_NewRef(Py_True);
        return p + 4;
    case 'f':
        *out = Py_NewRef(Py_False);
        return p + 5;
    case 'n':
        *out = Py_NewRef(Py_None);
        return p + 4;
    default:
        return build_number(p, out);
    }
}

#endif
