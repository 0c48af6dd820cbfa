# The C layout of persistence/durable_state.py's DurableState when compiled (see
# broker/message.pxd): the per-message hooks (message_enqueued, message_removed) are
# the compiled overrides of broker/durability.pxd's, and the figures they keep are C
# integers. Everything else runs as compiled Python.

cimport cython

from leveret.broker.durability cimport DurabilityHooks
from leveret.broker.message cimport Message
from leveret.broker.queues.base cimport Queue, QueueEntry
from leveret.broker.queues.classic cimport ClassicQueue

cdef Py_ssize_t _C_HEADS_CHECK_FROM  # HEADS_CHECK_FROM as a C integer


cdef class DurableState(DurabilityHooks):
    cdef public object data_dir
    cdef public object definitions
    cdef public object catalog
    cdef public object messages
    cdef public Py_ssize_t memory_budget
    cdef public Py_ssize_t queue_ram_messages
    cdef public Py_ssize_t queue_ram_bytes
    cdef public Py_ssize_t heads_used
    cdef public bint heads_full
    cdef public dict _head_costs
    cdef public double _heads_recounted
    cdef public Py_ssize_t memory_used
    cdef public Py_ssize_t paged_out
    cdef public Py_ssize_t paged_out_bytes
    cdef public Py_ssize_t disk_writes
    cdef public Py_ssize_t disk_reads
    cdef public bint _restoring
    cdef public double _started
    cdef public object loop
    cdef public object _disk_waiters
    cdef public object _disk_timer
    cdef public object _sharing
    cdef public object _delay_stores
    cdef public object delay_drops
    cdef object __weakref__

    # C locals: the budget arithmetic of every enqueue without Python ints.
    # `classic`: the queue as the C type that calls this (its fields, not lookups).
    @cython.locals(size=Py_ssize_t, ready_n=Py_ssize_t, over_budget=bint, persistent=bint,
                   classic=ClassicQueue)
    cpdef bint message_enqueued(
        self, Queue queue, QueueEntry entry, barrier, bint may_page=*
    ) except -1
    cpdef bint _heads_full(self, Queue queue) except -1
