# What workers/messages.py needs of C when compiled (see broker/message.pxd): the
# record's integers read straight out of its bytes, its parts cut without struct,
# and the `Message` made as the C type it is.

cimport cython

from leveret.broker.message cimport Message

cdef tuple _FLAG_BYTES
cdef list _last
cdef dict _ROUTES

@cython.locals(flags=Py_ssize_t, cache=bint)
cpdef bytes encode(Message message, bytes body=*)
cpdef remember(Message message, bytes data)
cpdef Message decode(bytes data)
