# The C layout of protocol/connection.py's Connection and _Channel when compiled.
# The parser reads a dozen of the connection's fields for every read and message;
# as C fields (not attribute lookups by name on a Python object) they cost a load
# each, and the content fast paths are C calls (cpdef: still callable from Python). Every field the class sets is here:
# an instance has no __dict__. handshake.py and lifecycle.py (plain Python) reach them
# by name too, so they must stay `public`.

cdef class _Channel:
    cdef public object number
    cdef public int state
    cdef public object content
    cdef public object header
    cdef public object body_left
    cdef public object parts


cdef class Connection:
    cdef public str role
    cdef public bint client
    cdef public object state
    cdef public object username
    cdef public object password
    cdef public object vhost
    cdef public object client_properties
    cdef public object server_properties
    cdef public object mechanisms
    cdef public object locale
    cdef public object frame_max
    cdef public object channel_max
    cdef public object heartbeat
    cdef public object _wanted_heartbeat
    cdef public object max_body_size
    cdef public object reader
    cdef public bytes _buf
    cdef public object _header_buf
    cdef public Py_ssize_t contents_parsed
    cdef public dict _channels
    cdef public list _out
    cdef public list _deferred
    cdef public list _events
    cdef public object _next_channel
    cdef public object channel_guard

    cpdef Py_ssize_t _deliveries(self, bytes buf, Py_ssize_t pos, Py_ssize_t n) except? -2
    cpdef Py_ssize_t _whole_content(
        self, bytes buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t n, int number,
        Py_ssize_t index, Py_ssize_t frame_max
    ) except? -2
