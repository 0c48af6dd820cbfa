# The C layout of server/connection_io.py's ConnectionIO when compiled: the fields its
# per-read and output methods use, as C fields. AMQPConnection (a Python subclass, with
# a __dict__ for everything else) sets them; `public` keeps them readable and writable
# by name from Python (the management API, the tests). write() is cpdef: a compiled
# Channel's delivery calls it in C.

cimport cython

from leveret.protocol.connection cimport Connection
from leveret.protocol.events cimport Publish
from leveret.server.model_methods cimport ModelMethods
from leveret.server.reading cimport ReadSizer, SharedReadBuffer


cpdef flush_written(list written)


cdef class ConnectionIO:
    cdef public object server
    cdef public object loop
    cdef public object transport
    cdef public Connection core
    cdef public object state
    cdef public dict channels
    cdef public object vhost
    cdef public bint _gated
    cdef public ReadSizer _sizer
    cdef public SharedReadBuffer _read_buffer  # the server's (one for all connections)
    cdef public object _busy_wait  # the server's BusyWait, or None (the default)
    cdef public long long recv_oct
    cdef public long long send_oct
    cdef public Py_ssize_t recv_cnt
    cdef public Py_ssize_t send_cnt
    cdef public double _last_recv
    cdef public double _last_send
    cdef public list _out
    cdef public Py_ssize_t _out_bytes
    cdef public bint _out_large
    cdef public object _flush_handle
    cdef public bint writable
    cdef public bint _transport_paused
    cdef public object _hold
    cdef public set _confirm_channels
    # read by every publish (server/publishing.py's on_publish)
    cdef public object alarm_reason
    cdef public object guard

    # ch: a channel as its base layer, so `closing` and on_publish are C (the
    # Channel itself cannot be cimported here: model_methods.pxd says why).
    @cython.locals(pub=Publish, ch=ModelMethods)
    cpdef _process(self, events)
    cpdef write(self, bytes data)
    cpdef _flush_soon(self)
    cpdef _flush(self)
