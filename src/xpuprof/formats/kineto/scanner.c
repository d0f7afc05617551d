/* The Kineto reader's compiled scanner (optional: without it the reader decodes with msgspec
 * and builds its columns in Python, ``columns.py``).
 *
 * scan(text) reads a run of Chrome-trace entries, ``[{...}, {...}, ...]``, checks that it is
 * strict JSON (RFC 8259: numbers, strings and their escapes, literals, nesting up to MAX_DEPTH),
 * and returns, per entry, where each field the reader keeps lies and what kind of value it is,
 * with the field's text already gathered into one buffer per column. It decides nothing about
 * what the values mean: ``fields.py`` turns this into the columns ``columns.py`` builds,
 * or declines.
 *
 * It returns None, not an error, for anything it does not handle, and the reader then takes its
 * usual path, which decodes the run again and names whatever is wrong: text that is not JSON, an
 * entry that is not an object, a key it does not know (the reader keeps those in ``extra``), a
 * key written with escapes or twice, nesting deeper than MAX_DEPTH. UTF-8 is not checked here:
 * Arrow checks every column built from the text.
 *
 * The scan runs without the GIL. Its per-entry arrays are handed to Python as they are, in
 * ``Buf`` objects that own them (no copy); when one is freed its memory is kept for the next
 * scan (one array of each kind, at most CACHE_MAX bytes each), so a reader scanning run after
 * run reuses memory it has touched already instead of faulting in fresh pages every time (a
 * third of the scan's time before). ``trim()`` frees what is kept: the reader calls it when a
 * file is read, so nothing stays held between reads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* kinds of values; keep in step with fields.py */
enum { K_ABSENT = 0, K_STR, K_ESC, K_INT, K_NUM, K_TRUE, K_FALSE, K_NULL, K_OBJ, K_ARR };

/* the entry's own fields, then the args' fields the data model lifts into columns */
#define N_TOP 11
#define F_ARGS 10
#define N_ARG 6
#define NF (N_TOP + N_ARG)
static const char *const FIELDS[NF] = {
    "ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args",
    "correlation", "External id", "external id", "device", "stream", "bytes",
};
/* the text columns gathered, and whether a string's text is taken without its quotes and
 * escapes unresolved (1) or as the raw JSON value (0) */
#define N_TEXT 11
static const int TEXT_FIELD[N_TEXT] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
static const int TEXT_INNER[N_TEXT] = {1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0};

#define MAX_DEPTH 256
#define BAD ((Py_ssize_t)-1)

typedef struct {
    const unsigned char *b;
    Py_ssize_t n;
    /* per entry and field: start, end (raw value), kind, integer value */
    int64_t *span;
    int8_t *kind;
    int64_t *ival;
    Py_ssize_t cap, count;
    Py_ssize_t sizes[N_TEXT]; /* bytes of each gathered text column so far */
} Scan;

static inline Py_ssize_t ws(const unsigned char *b, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) i++;
    return i;
}

static inline int hexdigit(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* b[i] is '"': the index after the string's closing quote, or BAD; *esc set when it holds a
 * backslash escape */
static unsigned char PLAIN[256]; /* 1: a byte a string holds as it is */

static Py_ssize_t string_end(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int *esc) {
    i++;
    while (i < n) {
        unsigned char c;
        while (i + 4 <= n && PLAIN[b[i]] && PLAIN[b[i + 1]] && PLAIN[b[i + 2]] && PLAIN[b[i + 3]])
            i += 4;
        if (i >= n) break;
        c = b[i];
        if (PLAIN[c]) {
            i++;
            continue;
        }
        if (c == '"') return i + 1;
        if (c == '\\') {
            *esc = 1;
            if (i + 1 >= n) return BAD;
            c = b[i + 1];
            if (c == 'u') {
                if (i + 5 >= n || !hexdigit(b[i + 2]) || !hexdigit(b[i + 3]) ||
                    !hexdigit(b[i + 4]) || !hexdigit(b[i + 5]))
                    return BAD;
                i += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                       c == 'r' || c == 't') {
                i += 2;
            } else {
                return BAD;
            }
            continue;
        }
        if (c < 0x20) return BAD;
        i++;
    }
    return BAD;
}

/* b[i] starts a number: the index after it, or BAD; *kind K_INT (an integer that fits int64,
 * written as Python would print it: not "-0") with its value in *val, else K_NUM */
static Py_ssize_t number_end(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int *kind,
                             int64_t *val) {
    int neg = 0, integral = 1, overflow = 0;
    uint64_t mag = 0;
    Py_ssize_t start = i;
    if (b[i] == '-') {
        neg = 1;
        i++;
    }
    if (i >= n) return BAD;
    if (b[i] == '0') {
        i++;
    } else if (b[i] >= '1' && b[i] <= '9') {
        while (i < n && b[i] >= '0' && b[i] <= '9') {
            uint64_t d = (uint64_t)(b[i] - '0');
            if (mag > (UINT64_MAX - d) / 10) overflow = 1;
            else mag = mag * 10 + d;
            i++;
        }
    } else {
        return BAD;
    }
    if (i < n && b[i] == '.') {
        i++;
        if (i >= n || b[i] < '0' || b[i] > '9') return BAD;
        while (i < n && b[i] >= '0' && b[i] <= '9') i++;
        integral = 0;
    }
    if (i < n && (b[i] == 'e' || b[i] == 'E')) {
        i++;
        if (i < n && (b[i] == '+' || b[i] == '-')) i++;
        if (i >= n || b[i] < '0' || b[i] > '9') return BAD;
        while (i < n && b[i] >= '0' && b[i] <= '9') i++;
        integral = 0;
    }
    if (integral && !overflow && !(neg && i - start == 2 && b[start + 1] == '0')) {
        if (!neg && mag <= (uint64_t)INT64_MAX) {
            *kind = K_INT;
            *val = (int64_t)mag;
            return i;
        }
        if (neg && mag <= (uint64_t)INT64_MAX + 1) {
            *kind = K_INT;
            *val = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
            return i;
        }
    }
    *kind = K_NUM;
    return i;
}

static Py_ssize_t value_end(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth,
                            int *kind, int64_t *val);

/* b[i] is '{' or '[': the index after the matching close, or BAD */
static Py_ssize_t nested_end(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth) {
    int k;
    int64_t v;
    if (depth >= MAX_DEPTH) return BAD;
    if (b[i] == '[') {
        i = ws(b, i + 1, n);
        if (i < n && b[i] == ']') return i + 1;
        for (;;) {
            i = value_end(b, i, n, depth + 1, &k, &v);
            if (i == BAD) return BAD;
            i = ws(b, i, n);
            if (i >= n) return BAD;
            if (b[i] == ']') return i + 1;
            if (b[i] != ',') return BAD;
            i = ws(b, i + 1, n);
        }
    }
    i = ws(b, i + 1, n);
    if (i < n && b[i] == '}') return i + 1;
    for (;;) {
        int esc = 0;
        if (i >= n || b[i] != '"') return BAD;
        i = string_end(b, i, n, &esc);
        if (i == BAD) return BAD;
        i = ws(b, i, n);
        if (i >= n || b[i] != ':') return BAD;
        i = ws(b, i + 1, n);
        i = value_end(b, i, n, depth + 1, &k, &v);
        if (i == BAD) return BAD;
        i = ws(b, i, n);
        if (i >= n) return BAD;
        if (b[i] == '}') return i + 1;
        if (b[i] != ',') return BAD;
        i = ws(b, i + 1, n);
    }
}

/* any JSON value at b[i]: the index after it, or BAD; its kind, and an integer's value */
static Py_ssize_t value_end(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth,
                            int *kind, int64_t *val) {
    int esc = 0;
    if (i >= n) return BAD;
    switch (b[i]) {
    case '"':
        i = string_end(b, i, n, &esc);
        *kind = esc ? K_ESC : K_STR;
        return i;
    case '{':
        *kind = K_OBJ;
        return nested_end(b, i, n, depth);
    case '[':
        *kind = K_ARR;
        return nested_end(b, i, n, depth);
    case 't':
        *kind = K_TRUE;
        return i + 4 <= n && memcmp(b + i, "true", 4) == 0 ? i + 4 : BAD;
    case 'f':
        *kind = K_FALSE;
        return i + 5 <= n && memcmp(b + i, "false", 5) == 0 ? i + 5 : BAD;
    case 'n':
        *kind = K_NULL;
        return i + 4 <= n && memcmp(b + i, "null", 4) == 0 ? i + 4 : BAD;
    default:
        if (b[i] == '-' || (b[i] >= '0' && b[i] <= '9')) return number_end(b, i, n, kind, val);
        return BAD;
    }
}

/* the field a key names (keys with escapes are never matched: the caller declines them) */
static Py_ssize_t FIELD_LEN[NF];

static int field_of(const unsigned char *key, Py_ssize_t len, int first, int last) {
    for (int f = first; f < last; f++) {
        if (FIELD_LEN[f] == len && key[0] == (unsigned char)FIELDS[f][0] &&
            memcmp(FIELDS[f], key, (size_t)len) == 0)
            return f;
    }
    return -1;
}

/* the length of a field's gathered text (see text_of): a string's content without its quotes
 * where the column takes it so, nothing for null there; else the value as written. Text
 * columns are fields 0 .. N_TEXT-1, in order (TEXT_FIELD). */
static inline Py_ssize_t text_len(int f, int kind, Py_ssize_t raw) {
    if (TEXT_INNER[f] && kind == K_NULL) return 0;
    if (TEXT_INNER[f] && (kind == K_STR || kind == K_ESC)) return raw - 2;
    return raw;
}

/* one object's keys and values, recording the fields in [first, last) of entry ``row``;
 * b[i] is '{'. ``args``: the object is an entry's args (fields it does not lift are skipped,
 * not refused). */
static Py_ssize_t object_end(Scan *s, Py_ssize_t i, Py_ssize_t row, int first, int last,
                             int args) {
    const unsigned char *b = s->b;
    Py_ssize_t n = s->n;
    i = ws(b, i + 1, n);
    if (i < n && b[i] == '}') return i + 1;
    for (;;) {
        int esc = 0, kind = K_ABSENT, f;
        int64_t val = 0;
        Py_ssize_t k0, k1, v0;
        if (i >= n || b[i] != '"') return BAD;
        k0 = i;
        k1 = string_end(b, i, n, &esc);
        if (k1 == BAD || esc) return BAD; /* an escaped key may spell a field: decline */
        f = field_of(b + k0 + 1, k1 - k0 - 2, first, last);
        if (f < 0 && !args) return BAD; /* a key the reader keeps in extra */
        i = ws(b, k1, n);
        if (i >= n || b[i] != ':') return BAD;
        i = ws(b, i + 1, n);
        v0 = i;
        if (f == F_ARGS && i < n && b[i] == '{') {
            i = object_end(s, i, row, N_TOP, NF, 1);
            kind = K_OBJ;
        } else {
            i = value_end(b, i, n, args ? 1 : 0, &kind, &val);
        }
        if (i == BAD) return BAD;
        if (f >= 0) {
            Py_ssize_t at = row * NF + f;
            if (s->kind[at] != K_ABSENT) return BAD; /* the same key twice */
            s->kind[at] = (int8_t)kind;
            s->ival[at] = val;
            s->span[2 * at] = v0;
            s->span[2 * at + 1] = i;
            if (f < N_TEXT) s->sizes[f] += text_len(f, kind, i - v0);
        }
        i = ws(b, i, n);
        if (i >= n) return BAD;
        if (b[i] == '}') return i + 1;
        if (b[i] != ',') return BAD;
        i = ws(b, i + 1, n);
    }
}

static int grow(Scan *s) {
    Py_ssize_t cap = s->cap ? 2 * s->cap : 4096;
    int64_t *span = realloc(s->span, (size_t)cap * NF * 2 * sizeof(int64_t));
    if (span) s->span = span;
    int8_t *kind = realloc(s->kind, (size_t)cap * NF);
    if (kind) s->kind = kind;
    int64_t *ival = realloc(s->ival, (size_t)cap * NF * sizeof(int64_t));
    if (ival) s->ival = ival;
    if (!span || !kind || !ival) return -1;
    s->cap = cap;
    return 0;
}

/* 1: scanned; 0: declined; -1: out of memory */
static int scan_all(Scan *s) {
    const unsigned char *b = s->b;
    Py_ssize_t n = s->n, i = ws(b, 0, n);
    if (i >= n || b[i] != '[') return 0;
    i = ws(b, i + 1, n);
    if (i < n && b[i] == ']') return ws(b, i + 1, n) == n;
    for (;;) {
        if (i >= n || b[i] != '{') return 0;
        if (s->count == s->cap && grow(s) < 0) return -1;
        memset(s->kind + s->count * NF, K_ABSENT, NF);
        memset(s->ival + s->count * NF, 0, NF * sizeof(int64_t));
        i = object_end(s, i, s->count, 0, N_TOP, 0);
        if (i == BAD) return 0;
        s->count++;
        i = ws(b, i, n);
        if (i >= n) return 0;
        if (b[i] == ']') return ws(b, i + 1, n) == n;
        if (b[i] != ',') return 0;
        i = ws(b, i + 1, n);
    }
}

/* the text of a field in entry ``row``: a string's content between its quotes (inner), else
 * the value as written; nothing when absent */
static inline void text_of(const Scan *s, Py_ssize_t row, int f, int inner, Py_ssize_t *a,
                           Py_ssize_t *z) {
    Py_ssize_t at = row * NF + f;
    int k = s->kind[at];
    *a = (Py_ssize_t)s->span[2 * at];
    *z = (Py_ssize_t)s->span[2 * at + 1];
    if (k == K_ABSENT || (inner && k == K_NULL)) {
        *a = *z = 0;
    } else if (inner && (k == K_STR || k == K_ESC)) {
        *a += 1;
        *z -= 1;
    }
}

/* -- the arrays handed to Python ------------------------------------------------------------ */

/* A read-only buffer over memory it owns: one of a scan's per-entry arrays. */
typedef struct {
    PyObject_HEAD
    void *p;
    Py_ssize_t len; /* bytes in use */
    size_t cap;     /* bytes allocated */
    int slot;       /* which array (0 span, 1 kind, 2 ival): where freed memory is kept */
} Buf;

/* the memory of the last array of each kind freed, for the next scan; touched only with the
 * GIL held (taken in scan() before the GIL is let go, given back by buf_dealloc) */
#define CACHE_MAX ((size_t)32 << 20)
static void *CACHE[3];
static size_t CACHE_CAP[3];
/* bytes per entry of each array, by slot */
static const size_t ROW_BYTES[3] = {NF * 2 * sizeof(int64_t), NF, NF * sizeof(int64_t)};

static void *cache_take(int slot, size_t *cap) {
    void *p = CACHE[slot];
    *cap = p ? CACHE_CAP[slot] : 0;
    CACHE[slot] = NULL;
    return p;
}

static void cache_give(int slot, void *p, size_t cap) {
    if (p && !CACHE[slot] && cap <= CACHE_MAX) {
        CACHE[slot] = p;
        CACHE_CAP[slot] = cap;
    } else {
        free(p);
    }
}

static int buf_getbuffer(PyObject *op, Py_buffer *view, int flags) {
    Buf *self = (Buf *)op;
    return PyBuffer_FillInfo(view, op, self->p, self->len, 1, flags);
}

static void buf_dealloc(PyObject *op) {
    Buf *self = (Buf *)op;
    cache_give(self->slot, self->p, self->cap);
    Py_TYPE(op)->tp_free(op);
}

static PyBufferProcs BUF_AS_BUFFER = {buf_getbuffer, NULL};

static PyTypeObject BufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "xpuprof.formats.kineto.scanner.Buf",
    .tp_basicsize = sizeof(Buf),
    .tp_dealloc = buf_dealloc,
    .tp_as_buffer = &BUF_AS_BUFFER,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A scan's per-entry array (read it with numpy.frombuffer).",
};

/* a Buf taking over p, an array of ``cap`` entries of which ``count`` are used (freed or kept
 * by the Buf from now on, also on failure) */
static PyObject *buf_new(int slot, void *p, Py_ssize_t count, Py_ssize_t cap) {
    Buf *b = PyObject_New(Buf, &BufType);
    if (!b) {
        cache_give(slot, p, (size_t)cap * ROW_BYTES[slot]);
        return NULL;
    }
    b->p = p;
    b->len = count * (Py_ssize_t)ROW_BYTES[slot];
    b->cap = (size_t)cap * ROW_BYTES[slot];
    b->slot = slot;
    return (PyObject *)b;
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    Py_buffer view;
    Scan s;
    int ok;
    size_t caps[3];
    PyObject *out = NULL, *texts = NULL, *kinds = NULL, *ivals = NULL, *spans = NULL;
    PyObject *offs[N_TEXT] = {0}, *datas[N_TEXT] = {0};
    (void)self;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    memset(&s, 0, sizeof s);
    s.b = (const unsigned char *)view.buf;
    s.n = view.len;
    /* the memory the last scan's arrays left, when it is there: all three or none */
    s.span = cache_take(0, &caps[0]);
    s.kind = cache_take(1, &caps[1]);
    s.ival = cache_take(2, &caps[2]);
    if (s.span && s.kind && s.ival) {
        size_t rows = caps[0] / ROW_BYTES[0];
        for (int k = 1; k < 3; k++)
            if (caps[k] / ROW_BYTES[k] < rows) rows = caps[k] / ROW_BYTES[k];
        s.cap = (Py_ssize_t)rows;
    } else {
        free(s.span);
        free(s.kind);
        free(s.ival);
        s.span = NULL;
        s.kind = NULL;
        s.ival = NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = scan_all(&s);
    Py_END_ALLOW_THREADS
    if (ok < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (ok == 0) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    texts = PyTuple_New(N_TEXT);
    if (!texts) goto done;
    for (int t = 0; t < N_TEXT; t++) {
        offs[t] = PyBytes_FromStringAndSize(NULL, (s.count + 1) * 8);
        datas[t] = PyBytes_FromStringAndSize(NULL, s.sizes[t]);
        if (!offs[t] || !datas[t]) goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (int t = 0; t < N_TEXT; t++) {
        int64_t *off = (int64_t *)PyBytes_AS_STRING(offs[t]);
        char *data = PyBytes_AS_STRING(datas[t]);
        int64_t pos = 0;
        off[0] = 0;
        for (Py_ssize_t r = 0; r < s.count; r++) {
            Py_ssize_t a, z;
            text_of(&s, r, TEXT_FIELD[t], TEXT_INNER[t], &a, &z);
            memcpy(data + pos, s.b + a, (size_t)(z - a));
            pos += z - a;
            off[r + 1] = pos;
        }
    }
    Py_END_ALLOW_THREADS
    for (int t = 0; t < N_TEXT; t++) {
        PyTuple_SET_ITEM(texts, t, Py_BuildValue("(OO)", offs[t], datas[t]));
        if (!PyTuple_GET_ITEM(texts, t)) goto done;
    }
    /* the Bufs own the arrays from here */
    spans = buf_new(0, s.span, s.count, s.cap);
    kinds = buf_new(1, s.kind, s.count, s.cap);
    ivals = buf_new(2, s.ival, s.count, s.cap);
    s.span = NULL;
    s.kind = NULL;
    s.ival = NULL;
    if (!spans || !kinds || !ivals) goto done;
    out = Py_BuildValue("(nOOOO)", s.count, kinds, ivals, spans, texts);
done:
    for (int t = 0; t < N_TEXT; t++) {
        Py_XDECREF(offs[t]);
        Py_XDECREF(datas[t]);
    }
    Py_XDECREF(kinds);
    Py_XDECREF(ivals);
    Py_XDECREF(spans);
    Py_XDECREF(texts);
    /* still here when the scan declined or failed: kept for the next scan */
    cache_give(0, s.span, (size_t)s.cap * ROW_BYTES[0]);
    cache_give(1, s.kind, (size_t)s.cap * ROW_BYTES[1]);
    cache_give(2, s.ival, (size_t)s.cap * ROW_BYTES[2]);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *trim(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    for (int k = 0; k < 3; k++) {
        size_t cap;
        free(cache_take(k, &cap));
    }
    Py_RETURN_NONE;
}

static PyObject *kept(PyObject *self, PyObject *unused) {
    size_t n = 0;
    (void)self;
    (void)unused;
    for (int k = 0; k < 3; k++) n += CACHE[k] ? CACHE_CAP[k] : 0;
    return PyLong_FromSize_t(n);
}

static PyMethodDef METHODS[] = {
    {"trim", trim, METH_NOARGS, "trim(): free the memory kept for the next scan."},
    {"kept", kept, METH_NOARGS, "kept() -> bytes of memory kept for the next scan."},
    {"scan", scan, METH_O,
     "scan(text) -> (n, kinds, ivals, spans, texts) or None: a run of Chrome-trace entries, "
     "checked and cut into fields (see fields.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "scanner", "The Kineto reader's compiled scanner.", -1, METHODS,
};

PyMODINIT_FUNC PyInit_scanner(void) {
    for (int f = 0; f < NF; f++) FIELD_LEN[f] = (Py_ssize_t)strlen(FIELDS[f]);
    for (int c = 0; c < 256; c++) PLAIN[c] = c >= 0x20 && c != '"' && c != '\\';
    if (PyType_Ready(&BufType) < 0) return NULL;
    return PyModule_Create(&MODULE);
}
