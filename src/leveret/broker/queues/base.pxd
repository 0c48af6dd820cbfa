# The C layout of broker/queues/base.py when compiled (see broker/message.pxd): the
# queue entry, and what the channel's compiled delivery and ack path reads of any
# queue type. A queue type written in Python (the stream) subclasses Queue as it is;
# the methods are cpdef, so a Python subclass overrides them as usual. Argument
# types follow the .py's annotations (Cython types a parameter by its annotation).

from leveret.broker.message cimport Message
from leveret.broker.stats cimport MessageStats


cdef class QueueEntry:
    cdef public Py_ssize_t seq
    cdef public Message message
    cdef public bint redelivered
    cdef public double expires_at
    cdef public double delivered_at
    cdef public object location


cdef class Queue:
    cdef public object vhost
    cdef public object name
    cdef public MessageStats stats
    cdef public list consumers
    cdef public bint deleted
    cdef public bint tracked
    cdef public Py_ssize_t unacked

    cpdef bint enqueue(self, Message message, barrier=*) except -1
    cpdef dispatch(self, bint check_expiry=*)
    cpdef settle(self, QueueEntry entry)
    cpdef removed(self, QueueEntry entry)
    cpdef bytes delivery_body(self, QueueEntry entry)
    cpdef bint consumers_behind(self) except -1
