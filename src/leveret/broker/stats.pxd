# The C layout of broker/stats.py's MessageStats when compiled (see broker/message.pxd):
# the counters are C integers, so the compiled hot path's `stats.deliver += 1` is one
# add. Python code (the Sampler, the management API) reads them by name, as attributes.

cdef class MessageStats:
    cdef public Py_ssize_t publish
    cdef public Py_ssize_t publish_in
    cdef public Py_ssize_t publish_out
    cdef public Py_ssize_t confirm
    cdef public Py_ssize_t deliver
    cdef public Py_ssize_t deliver_no_ack
    cdef public Py_ssize_t get
    cdef public Py_ssize_t get_no_ack
    cdef public Py_ssize_t get_empty
    cdef public Py_ssize_t redeliver
    cdef public Py_ssize_t ack
    cdef public Py_ssize_t return_unroutable
    cdef public Py_ssize_t drop_unroutable
    cdef public Py_ssize_t publish_confirm
    cdef public object rates
    cdef public object _last
    cdef public object depth_rates
    cdef public object _last_depth
