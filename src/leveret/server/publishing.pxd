# The C layout of server/publishing.py's PublishMethods when compiled: the channel's
# publish-side state, which its hot path (on_publish, _route) reads as C fields.
# Channel (server/channel.pxd) builds on it; see server/model_methods.pxd.

cimport cython

from leveret.broker.exchange cimport Exchange
from leveret.broker.message cimport Message
from leveret.broker.queues.base cimport Queue
from leveret.protocol.events cimport Publish
from leveret.protocol.properties cimport publish_flags
from leveret.broker.stats cimport MessageStats
from leveret.server.connection_io cimport ConnectionIO
from leveret.server.model_methods cimport ModelMethods


cdef Py_ssize_t _C_USER_ID
cdef Py_ssize_t _C_SPECIAL


cdef class PublishMethods(ModelMethods):
    cdef public ConnectionIO conn
    cdef public Py_ssize_t number
    cdef public object vhost
    cdef public dict exchanges
    cdef public dict queues
    cdef public object default_exchange
    # (`closing`: model_methods.pxd)
    cdef public MessageStats stats
    cdef public bint confirm_mode
    cdef public Py_ssize_t publish_seq
    cdef public Py_ssize_t confirms_folded
    cdef public Py_ssize_t confirmed_upto
    cdef public dict confirm_waiting
    cdef public object tx
    cdef public object _write_failures
    cdef public object reply_token
    cdef public object reply_consumer_tag

    @cython.locals(flags=Py_ssize_t, delivery_mode=Py_ssize_t, exchange=Exchange)
    cpdef on_publish(self, Publish event)
    # (An annotation alone does not type `queue`: the .py imports the name too.)
    # routing_key: a str, so startswith() is a C call, not a method lookup.
    @cython.locals(queue=Queue, routing_key=str)
    cpdef _route(self, Exchange exchange, Message message, bint mandatory, barrier=*)
