# The C layout of broker/consumer.py's Consumer when compiled (see broker/message.pxd).
# `channel` stays a Python object: any broker.ports.DeliveryChannel will do.

cdef class Consumer:
    cdef public object tag
    cdef public object channel
    cdef public object queue
    cdef public bint no_ack
    cdef public bint exclusive
    cdef public Py_ssize_t prefetch
    cdef public object priority
    cdef public Py_ssize_t unacked
    cdef public object arguments
    cdef public object ctag_prefix
    cdef public bint active

    cpdef bint can_take(self)
