# The C layout of protocol/events.py's Event and Publish when compiled. A publish is
# read field by field on the hot path (server/publishing.py's on_publish types its
# argument as Publish): C fields instead of slot lookups by name. The other events
# stay Python classes (with __slots__) built on the compiled Event.

cdef class Event:
    pass


cdef class Publish(Event):
    cdef public Py_ssize_t channel
    cdef public str exchange
    cdef public str routing_key
    cdef public bint mandatory
    cdef public bint immediate
    cdef public bytes names
    cdef public bytes header
    cdef public bytes body
