# The C layout of broker/exchange.py's Exchange when compiled (see broker/message.pxd).
# Every publish reads its exchange's `internal`, `name` and `stats`: as C fields, a
# compiled channel (server/publishing.pxd) reads them without lookups by name. An
# exchange has no __dict__: every attribute it carries is declared here.

from leveret.broker.stats cimport MessageStats


cdef class Exchange:
    cdef public object vhost_name
    cdef public object name
    cdef public object type_name
    cdef public bint durable
    cdef public bint auto_delete
    cdef public bint internal
    cdef public dict arguments
    cdef public object router
    cdef public dict bindings
    cdef public set inbound
    cdef public bint deleted
    cdef public object policy_alternate
    cdef public MessageStats stats
    cdef public object declared_by
    cdef object __weakref__
