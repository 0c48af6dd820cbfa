# The C layout of broker/message.py's Message when compiled
# (docs/architecture.md#the-compiled-hot-path): Cython reads this beside the .py, which stays plain Python.
# Typed attributes are C fields: the compiled hot path (queues, the channel) reads
# them without a dictionary or descriptor lookup. `public`: Python code sees them too.

cdef class Message:
    cdef public object exchange
    cdef public object routing_key
    cdef public object header
    cdef public object body
    cdef public Py_ssize_t flags
    cdef public bint persistent
    cdef public object exchange_and_key
    cdef public object routing_keys
    cdef public Py_ssize_t size
    cdef public object ttl
    cdef public object _properties
    cdef public object _headers
