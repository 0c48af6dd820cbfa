# The C layout of broker/queues/classic.py when compiled (see broker/message.pxd):
# the queue's ready messages and its enqueue/dispatch/settle path as C types. A queue
# type built on the classic one (quorum) subclasses these in Python; what it may
# override is cpdef.

cimport cython

from leveret.broker.consumer cimport Consumer
from leveret.broker.durability cimport DurabilityHooks
from leveret.broker.message cimport Message
from leveret.broker.queues.base cimport Queue, QueueEntry

# C copies of FLOW_LIMIT and FLOW_RESUME: compared with a C count, no int is boxed.
cdef Py_ssize_t _C_FLOW_LIMIT
cdef Py_ssize_t _C_FLOW_RESUME


cdef class ReadyMessages:
    cdef public object _fresh
    cdef public list _returned
    cdef public object tail
    cdef public Py_ssize_t _bytes
    cdef public Py_ssize_t n
    cdef public object loader
    cdef public object dropper
    cdef public Py_ssize_t tail_seq
    cdef public double restored_at
    cdef public Py_ssize_t restored_left

    cpdef append(self, QueueEntry entry)
    cpdef put_back(self, QueueEntry entry)
    cpdef _refill(self)
    cpdef QueueEntry peek(self)
    # entry typed: its message's size is C fields, not two lookups by name
    @cython.locals(entry=QueueEntry)
    cpdef QueueEntry popleft(self)
    cpdef list clear(self)


cdef class PriorityReadyMessages(ReadyMessages):
    cdef public list levels
    cdef public Py_ssize_t max_priority


cdef class ClassicQueue(Queue):
    cdef public DurabilityHooks hooks
    cdef public object durable
    cdef public object exclusive_owner
    cdef public object auto_delete
    cdef public object arguments
    cdef public object options
    cdef public bint plain
    cdef public bint pageable
    cdef public object dedup
    cdef public bint expiring
    cdef public Py_ssize_t max_priority
    cdef public ReadyMessages ready
    cdef public Py_ssize_t _rr
    cdef public object _top_priority
    cdef public Py_ssize_t _seq
    cdef public object bindings
    cdef public bint had_consumer
    cdef public object throttled
    cdef public bint stores_messages
    cdef public Py_ssize_t persistent
    cdef public Py_ssize_t persistent_bytes
    cdef public object _expiry_timer
    cdef public double _expiry_due
    cdef public object _idle_timer

    cpdef _paged_one(self, ReadyMessages ready)
    # The chosen consumer as a C type: can_take() a C call, its flags C fields.
    @cython.locals(best=Consumer, c=Consumer)
    cpdef dispatch(self, bint check_expiry=*)
    cpdef bint consumers_behind(self) except -1
