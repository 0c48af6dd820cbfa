# The C layout of server/channel.py's Channel when compiled: the delivery side's state
# on top of the publish side's (server/publishing.pxd, server/model_methods.pxd).
# deliver() and ack() are the hot path: C calls from the compiled queues.

cimport cython

from leveret.broker.consumer cimport Consumer
from leveret.broker.queues.base cimport Queue, QueueEntry
from leveret.protocol.methods cimport deliver_frames
from leveret.server.publishing cimport PublishMethods


cdef class Channel(PublishMethods):
    cdef public bint flow_active
    cdef public bint deliverable
    cdef public dict consumers
    cdef public dict unacked
    cdef public Py_ssize_t unacked_count
    cdef public Py_ssize_t delivery_tag
    cdef public object prefetch_count
    cdef public Py_ssize_t global_prefetch
    cdef public Py_ssize_t credit_out
    cdef public object last_queue_name
    cdef public object generated_queue_name
    cdef public object _ack_timer
    cdef public dict _handlers
    cdef public Py_ssize_t body_max

    cpdef deliver(self, Consumer consumer, Queue queue, QueueEntry entry)
    @cython.locals(queue=Queue, entry=QueueEntry, consumer=Consumer)
    cpdef set _settle_acked(self, list taken)
