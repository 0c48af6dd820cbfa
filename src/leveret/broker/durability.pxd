# The C layout of broker/durability.py's DurabilityHooks when compiled (see
# broker/message.pxd): the per-message hooks are cpdef, so a compiled queue calls the
# store's compiled overrides (persistence/durable_state.pxd) as C calls.

from leveret.broker.queues.base cimport Queue, QueueEntry


cdef class DurabilityHooks:
    cdef public bint active
    cdef public bint recovering

    cpdef bint message_enqueued(
        self, Queue queue, QueueEntry entry, barrier, bint may_page=*
    ) except -1
    cpdef message_removed(self, Queue queue, QueueEntry entry)
